"""Which of the ranked configs the tuner times: the top k, and the configs the model is known to
misjudge that come after them.

`RankingModel` predicts each config's time (`space/ranking.py`); this module decides what of
that order to trust. The model sees no difference between a config and its twins in epilogue,
cluster shape or operand swap where timing finds one, and its errors are largest between
classes of kernels; so one of a tie takes a place, every class near the fastest is
represented, and a few twins the model misjudges in known ways are timed beside the k.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from gemmtune.core.config import Decomposition, GemmConfig, Raster, Schedule
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels.schedule_model import TileGrid, ceil_div
from gemmtune.kernels.sm90.rules import (
    ODD_EIGHT_TILE_NS,
    TILE_K_BYTES,
    WIDE_STAGE_K_BYTES,
    accumulator_registers,
    epi_tile,
)

if TYPE_CHECKING:
    from gemmtune.space.ranking import RankingModel

#: The model's errors are largest between classes of kernels (ping-pong against cooperative
#: warpgroups, swapped operands or not): a class whose best is predicted within this much of
#: the fastest gets a place in the top k, so that one class cannot fill every place.
CLASS_MARGIN = 0.05
#: A config whose cluster spans the whole of the problem's short side reads each tile of the
#: larger operand (a linear layer's weight) once, multicast to the tiles beside it; the same
#: tile in another cluster shape has several clusters fetch it. The model does not see the
#: difference (families are fitted on problems where every config fetches both operands many
#: times), yet timed it is about 1.2x on problems of a few hundred rows (H200: 333 x 4096 x
#: 4096 swapped 64x176 in clusters of 1x2 14.1 µs fp8, 20.1 bf16, against 17.3 and 26.2 in
#: clusters of 2x1; 128 x 6144 x 4096 64x96 in clusters of 2x1 11.5 µs fp8, 18.5 bf16, against
#: 13.6 and 22.2 unclustered). Where none of the top k reads the larger operand once
#: (`reads_larger_once`), the best config that does is timed beside them if predicted within
#: `ONCE_MARGIN` of the fastest.
ONCE_MARGIN = 0.25
#: On a skewed problem whose work is one wave (128 rows against a weight, a decode batch's
#: swapped tiles), a data-parallel config that does not read the larger operand once gives its
#: place in the top k to its twin that does, the first of these cluster shapes (fewest CTAs
#: first) that spans the short side and stays one wave: the families' `c` per item, fitted
#: where a tile's epilogue overlaps the next tile's mainloop, favours 2x2 and 1x2 shapes there
#: by 2-4 µs, yet timed the 64-row tiles that read the weight twice ran 15-35 % slower than
#: their 2x1 shape (`docs/ranking.md`). (A single CTA reads once only where the short side is
#: one tile, and there every shape does.)
ONCE_TWIN_SHAPES = ((2, 1), (1, 2), (4, 1), (1, 4), (2, 2))
#: How many times the smaller operand's elements the larger must hold for the class to apply:
#: a weight against a batch of activations. Where the two are alike (small-MN problems split
#: along K) every config fetches both several times.
ONCE_OPERAND_RATIO = 8
#: A binary with the TMA-store epilogue and its twin with thread stores, or the same tile in
#: another cluster shape, predicted within `TIE_MARGIN` of each other, are a tie the model
#: cannot order: at the memory floor they stream the same bytes. One of a tie takes a place in
#: the top k, so that one tile's variants cannot fill it (a decode problem's top 8 held three
#: cluster shapes of one stream-K tile, each with both epilogues; a gate-up projection's held
#: two tiles in three cluster shapes each, and not the 128x16 tile that ran 4-7 % faster).
#: Cluster shapes do differ when timed, so the tuner times the leaders' other shapes after the
#: first pass (`tuning.tuner`).
TIE_MARGIN = 0.01


#: The longest rows of an output sub-tile, in bytes, that make its stores slow: a tile
#: 144, 176 or 208 wide stores 16-column sub-tiles, rows of 32 bytes in a 16-bit row-major
#: output, where its operand-swapped twin (the same kernel writing the output's transpose)
#: stores columns of 64 to 192 rows. The families, fitted on unswapped binaries writing
#: row-major outputs, predict the two alike; timed (fp8 into bf16 on an H200, 2112 x 2112 x K,
#: beside torch._scaled_mm) the swapped twins ran 0.45-1.37 µs faster at K = 2048 (128x176
#: ping-pong 0.77, 192x176 cooperative 0.88, 64x208 ping-pong 1.37, 128x144 cooperative 0.45;
#: 256x144 and 128x80 within 0.3 either way), and tiles 32 columns wide 0.06-0.21 slower.
#: Where the two are predicted alike, the config that stores longer rows takes the place.
SHORT_STORE_ROW_BYTES = 32


def short_store_rows(config: GemmConfig, problem: GemmProblem) -> bool:
    """Whether a Hopper config's epilogue stores its sub-tiles in rows of at most
    `SHORT_STORE_ROW_BYTES` (the output's contiguous mode as the kernel sees it: N, or M for
    an M-major output, the other way round for a swapped config)."""
    if config.arch != "sm_90":
        return False
    epi_m, epi_n = epi_tile(config)
    kernel_m_major = (problem.out_major == "m") != config.swap_ab
    row = epi_m if kernel_m_major else epi_n
    return row * problem.out_dtype.itemsize <= SHORT_STORE_ROW_BYTES


#: Ping-pong tiles of this many accumulators per thread (128x128, 64x256) are the leaders of
#: compute-bound 8-bit problems that the 16-bit families rank far down: each of their
#: warpgroups' epilogues overlaps the other's mainloop, half as long as a 16-bit tile's, and
#: the per-item constant fitted on 16-bit tiles overcharges it (fp8 on an H200, each config
#: beside torch._scaled_mm in windows: 128x128 in clusters of 2x1 ran 2048^3 per row in 17.3
#: µs where the suites' 128x176 ran 20.7, 4096^3 per tensor 95.6 µs against 99.9-102.7 for the
#: top 8's leaders; `docs/ranking.md`). Where the top k holds none, the one predicted fastest
#: in a cluster of two CTAs (the shape of the best such binary on every compute-bound shape of
#: the windowed fp8 timings; unclustered, 1000 x 6144 x 4096 ran 45.9 µs against 37.6) with
#: more tiles than SMs (where a CTA has a second tile to overlap) is timed beside them.
EIGHT_BIT_PINGPONG_REGISTERS = 128
#: A cluster of two whose second CTA falls past the problem's last tile along the cluster's
#: side (31 tiles of 144 on 4352 columns in clusters of 1x2) leaves an SM idle for that unit,
#: which the model's per-unit constants do not see: the two shapes of a tile are predicted
#: within `TIE_MARGIN` and one takes the place. Timed, either may win: fp8 1024 x 4352 x 4096
#: (H200, per tensor, windows beside torch._scaled_mm) ran ping-pong 128x144 in clusters of
#: 1x2 in 33.0-33.5 µs and of 2x1 (no CTA idle) in 29.9-31.0, cuBLASLt's own tiling; yet
#: 4096 x 28672 x 4096's exhaustive best is 128x176 in clusters of 1x2, whose 163 columns of
#: tiles leave one CTA idle. So on compute-bound problems a padded data-parallel cluster of
#: two in the top k brings its transposed shape after them where that one pads nothing. On
#: the exhaustive fp8 timings this took 1k x 4352's replayed tune from 0.955-0.957 of the
#: best to 1.000, changed no other shape and added a binary on 3 of 19; on the 16-bit
#: timings it added none (`docs/ranking.md`).
PADDED_CLUSTER_CTAS = 2


#: The fields a tie's configs may differ in.
TIE_FIELDS = frozenset({"tma_store", "cluster_m", "cluster_n"})
_TIE_KEY_FIELDS = tuple(f.name for f in dataclasses.fields(GemmConfig) if f.name not in TIE_FIELDS)


def pads_cluster(config: GemmConfig, problem: GemmProblem) -> bool:
    """Whether some of the config's clusters hold a CTA past the problem's last tile: its
    tiles along a cluster's side are not a multiple of the cluster's CTAs there."""
    grid = TileGrid.of(config, problem.m, problem.n, problem.l)
    return grid.tiles_m % grid.cluster_m != 0 or grid.tiles_n % grid.cluster_n != 0


#: The most rows (a problem's M, the swapped kernel's N) for which a width of
#: `rules.ODD_EIGHT_TILE_NS` is ranked: cuBLASLt takes such widths for batches of a few hundred
#: rows (88 for 777, 104 for 300, 200 for 200; docs/kernels.md), where padding a tile's rows
#: costs a whole row of tiles. The families give them constants interpolated between the
#: fitted widths (`full_swizzle_constants`); they have not been timed on larger problems.
ODD_EIGHT_MAX_ROWS = 896


def fits_rows(config: GemmConfig, problem: GemmProblem) -> bool:
    """Whether the ranking ranks `config` for `problem`: any config but one of a width of
    `rules.ODD_EIGHT_TILE_NS`, which is ranked swapped, on at most `ODD_EIGHT_MAX_ROWS` rows,
    where its tiles hold fewer rows than those of the narrowest multiple of 16 that cuts the
    rows into as few tiles or fewer (777 rows: nine of 88 hold 792, nine of 96 864; 512 rows:
    ten of 56 hold 560, eight of 64 512)."""
    if config.tile_n not in ODD_EIGHT_TILE_NS:
        return True
    if not config.swap_ab or problem.m > ODD_EIGHT_MAX_ROWS:
        return False
    tiles = ceil_div(problem.m, config.tile_n)
    even = ceil_div(ceil_div(problem.m, tiles), 16) * 16
    return tiles * config.tile_n < ceil_div(problem.m, even) * even


def tie_key(config: GemmConfig) -> tuple:
    """What the configs of one tie share: everything but the epilogue and the cluster shape."""
    return tuple(getattr(config, name) for name in _TIE_KEY_FIELDS)


def skewed(problem: GemmProblem) -> bool:
    """Whether one operand holds at least `ONCE_OPERAND_RATIO` times the other's elements."""
    return max(problem.m, problem.n) >= ONCE_OPERAND_RATIO * min(problem.m, problem.n)


def reads_larger_once(config: GemmConfig, problem: GemmProblem) -> bool:
    """Whether one cluster fetches each tile of the problem's larger operand: its cluster
    spans every tile of the other side (the kernel's A is multicast along the cluster's N, its
    B along M; a `swap_ab` kernel's A is the problem's b)."""
    grid = TileGrid.of(config, problem.m, problem.n, problem.l)
    b_larger = problem.n >= problem.m
    kernel_a_larger = b_larger == config.swap_ab
    return (grid.clusters_n if kernel_a_larger else grid.clusters_m) == 1


_STORE_TWIN_FIELDS = tuple(f.name for f in dataclasses.fields(GemmConfig) if f.name != "tma_store")


def store_twin_key(config: GemmConfig) -> tuple:
    """What a config and its twin of the other epilogue (TMA store or thread stores) share."""
    return tuple(getattr(config, name) for name in _STORE_TWIN_FIELDS)


def stores_by_threads_beside_tma(config: GemmConfig, tma_stores: set[tuple]) -> bool:
    """Whether `config` stores by threads where its TMA-store twin is offered too (an output
    TMA can store; `tma_stores`: the `store_twin_key`s of the offered TMA-store configs).
    `top_k` does not rank such a config: one warp stores asynchronously where every thread
    of a thread store waits for its own, and timed side by side they were never faster
    (0.5-5 % slower on 4096^3, equal on 128 x 6144 x 4096; `docs/kernels.md`), while their
    families, fitted on another day's timings than the TMA-store ones, put some ahead by
    more than `TIE_MARGIN`. They serve outputs TMA cannot store, where they are all there is."""
    return not config.tma_store and store_twin_key(config) in tma_stores


def top_k(
    model: RankingModel, problem: GemmProblem, configs: list[GemmConfig], k: int
) -> list[GemmConfig]:
    """The k configs predicted fastest, among those at the default raster and swizzle (the
    tuner sweeps those on what it compiles), with every *class* (schedule and operand swap)
    whose best is predicted within `CLASS_MARGIN` of the fastest represented by that best.
    A swapped config takes a place only when it is predicted faster than its unswapped
    twin, and a split-K or stream-K config only when predicted faster than its
    data-parallel twin: where the model sees no difference between the two, timing both
    would spend two places on one guess; for the same reason a tie of epilogues or cluster
    shapes (`tie_key`, `TIE_MARGIN`) takes one place, and a thread-store config is not
    ranked where its TMA-store twin is offered, nor one of a width of an odd number of
    8-column blocks where it does not fit the rows (`fits_rows`). A narrow tile's 256-byte
    stages take a place only when predicted faster than its 128-byte ones (at the memory
    floor, where they rank ahead of every 128-byte config), and its 128-byte stages none
    there. Where
    none of the k reads the larger operand once and a config that does is predicted
    within `ONCE_MARGIN`, the best such config comes as a (k+1)-th; where a compute-bound
    8-bit problem's k hold no ping-pong tile of `EIGHT_BIT_PINGPONG_REGISTERS`
    accumulators, the best of those comes after them (`_pingpong_pick`), and on a
    compute-bound problem a data-parallel cluster of two among the k whose clusters hold
    a CTA past the last tile brings its transposed shape where that one holds none
    (`_unpadded_twins`, `PADDED_CLUSTER_CTAS`). Before that, a
    one-wave config that reads it twice gives its place to its twin that reads it once
    (`_once_twin`; two that share a twin leave one place empty). Of a config and its
    operand-swapped twin predicted alike, the one whose epilogue stores rows longer than
    `SHORT_STORE_ROW_BYTES` takes the place (`short_store_rows`)."""
    offered = set(configs)
    tma_stores = {store_twin_key(c) for c in configs if c.tma_store}
    defaults = [
        c
        for c in configs
        if c.raster is Raster.ALONG_M
        and c.swizzle == 1
        and not stores_by_threads_beside_tma(c, tma_stores)
        and fits_rows(c, problem)
    ]
    ranked = model.rank(problem, defaults)
    predicted = {c: t for t, c in ranked}

    def yields_to_twin(config: GemmConfig) -> bool:
        """Whether `config` gives its place to its operand-swapped twin: predicted no
        slower, storing longer rows (`short_store_rows`)."""
        twin = dataclasses.replace(config, swap_ab=not config.swap_ab)
        return (
            predicted.get(twin, math.inf) <= predicted.get(config, math.inf)
            and short_store_rows(config, problem)
            and not short_store_rows(twin, problem)
        )

    def twins(config: GemmConfig) -> list[GemmConfig]:
        found = []
        if config.swap_ab:
            unswapped = dataclasses.replace(config, swap_ab=False)
            if not yields_to_twin(unswapped):
                found.append(unswapped)
        if config.stage_k_bytes > TILE_K_BYTES:
            found.append(dataclasses.replace(config, stage_k_bytes=TILE_K_BYTES))
        if config.decomposition is not Decomposition.DATA_PARALLEL:
            found.append(
                dataclasses.replace(config, decomposition=Decomposition.DATA_PARALLEL, splits=1)
            )
        return found

    def wider_stages(config: GemmConfig) -> GemmConfig | None:
        if config.stage_k_bytes != TILE_K_BYTES:
            return None
        return dataclasses.replace(config, stage_k_bytes=WIDE_STAGE_K_BYTES)

    kept: dict[GemmConfig, float] = {}
    classes: set[tuple] = set()
    ties: dict[tuple, list[float]] = {}
    fastest = None
    for t, config in ranked:  # fastest first: stop once no class or place is left to fill
        if fastest is not None and len(kept) >= k and t > fastest * (1 + CLASS_MARGIN):
            break
        if any(t >= predicted.get(twin, math.inf) for twin in twins(config)):
            continue
        if yields_to_twin(config):
            continue
        if predicted.get(wider_stages(config), math.inf) < t:
            continue
        tie = ties.setdefault(tie_key(config), [])
        if any(t <= other * (1 + TIE_MARGIN) for other in tie):
            continue
        tie.append(t)
        fastest = t if fastest is None else fastest
        cls = (config.schedule, config.swap_ab)
        if len(kept) < k or (cls not in classes and t <= fastest * (1 + CLASS_MARGIN)):
            kept[config] = t
        classes.add(cls)
    # the classes' representatives displace the slowest of the plain top k
    by_class: dict[tuple, GemmConfig] = {}
    for config in sorted(kept, key=kept.__getitem__):
        by_class.setdefault((config.schedule, config.swap_ab), config)
    rest = [c for c in sorted(kept, key=kept.__getitem__) if c not in by_class.values()]
    chosen = list(by_class.values()) + rest[: max(0, k - len(by_class))]
    kept = {c: kept[c] for c in chosen}
    top = sorted(kept, key=kept.__getitem__)[:k]
    top = list(dict.fromkeys(_once_twin(model, problem, c, predicted) for c in top))
    extra = [
        *_unpadded_twins(model, problem, top, offered),
        _reads_once_pick(model, problem, ranked, top),
        _pingpong_pick(model, problem, ranked, top),
    ]
    return [*top, *(c for c in dict.fromkeys(extra) if c is not None and c not in top)]


def _unpadded_twins(
    model: RankingModel, problem: GemmProblem, top: list[GemmConfig], offered: set[GemmConfig]
) -> list[GemmConfig]:
    """For a compute-bound problem, the transposed cluster shape of each data-parallel
    config of `top` in a cluster of `PADDED_CLUSTER_CTAS` that `pads_cluster`, where
    `offered` holds it and it pads nothing."""
    if model.memory_bound(problem):
        return []
    found = []
    for config in top:
        if (
            config.decomposition is not Decomposition.DATA_PARALLEL
            or config.cluster_m * config.cluster_n != PADDED_CLUSTER_CTAS
            or not pads_cluster(config, problem)
        ):
            continue
        twin = dataclasses.replace(config, cluster_m=config.cluster_n, cluster_n=config.cluster_m)
        if twin in offered and not pads_cluster(twin, problem):
            found.append(twin)
    return found


def _pingpong_pick(
    model: RankingModel,
    problem: GemmProblem,
    ranked: list[tuple[float, GemmConfig]],
    top: list[GemmConfig],
) -> GemmConfig | None:
    """For a compute-bound 8-bit problem where `top` holds no data-parallel ping-pong tile
    of `EIGHT_BIT_PINGPONG_REGISTERS` accumulators per thread in a cluster of two
    (unswapped, TMA store), the one predicted fastest of more tiles than SMs; else None."""
    if problem.a_dtype.itemsize != 1 or model.memory_bound(problem):
        return None

    def small_pingpong(config: GemmConfig) -> bool:
        return (
            config.schedule is Schedule.PINGPONG
            and config.decomposition is Decomposition.DATA_PARALLEL
            and accumulator_registers(config) == EIGHT_BIT_PINGPONG_REGISTERS
            and config.cluster_m * config.cluster_n == 2
            and not config.swap_ab
            and config.tma_store
        )

    if any(small_pingpong(c) for c in top):
        return None
    return next(
        (c for _, c in ranked if small_pingpong(c) and model.tiles_per_sm(problem, c) > 1),
        None,
    )


def _once_twin(
    model: RankingModel, problem: GemmProblem, config: GemmConfig, offered: dict[GemmConfig, float]
) -> GemmConfig:
    """`config`, or where the problem is `skewed` and `config` is data-parallel, of one
    wave and does not read the larger operand once, its twin in the cluster shape of
    fewest CTAs that does and stays one wave, where `offered` holds it (`ONCE_TWIN_SHAPES`)."""
    if (
        config.decomposition is not Decomposition.DATA_PARALLEL
        or not skewed(problem)
        or reads_larger_once(config, problem)
        or not model.one_wave(problem, config)
    ):
        return config
    for cluster_m, cluster_n in ONCE_TWIN_SHAPES:
        twin = dataclasses.replace(config, cluster_m=cluster_m, cluster_n=cluster_n)
        if twin in offered and reads_larger_once(twin, problem) and model.one_wave(problem, twin):
            return twin
    return config


def _reads_once_pick(
    model: RankingModel,
    problem: GemmProblem,
    ranked: list[tuple[float, GemmConfig]],
    top: list[GemmConfig],
) -> GemmConfig | None:
    """The config predicted fastest of those that read the larger operand once, where it
    is at least `ONCE_OPERAND_RATIO` times the smaller, none of `top` does and it is
    predicted within `ONCE_MARGIN` of the fastest; else None."""
    if not ranked or not skewed(problem):
        return None
    if any(reads_larger_once(c, problem) for c in top):
        return None
    limit = ranked[0][0] * (1 + ONCE_MARGIN)
    for t, config in ranked:
        if t > limit:
            return None
        if reads_larger_once(config, problem):
            return config
    return None
