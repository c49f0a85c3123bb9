"""Predicting each candidate's time, so that the tuner compiles and times only the best few.

The model is analytic in its structure and fitted in its constants:
- A *family* is a tile shape, cluster shape, schedule and epilogue. One CTA of family f spends
  `a_f` µs per k-tile of its tile and `c_f` µs per item (prologue, epilogue, pipeline fill).
- A data-parallel launch runs `ceil(units / resident clusters)` waves of whole units
  (wave quantization); stream-K and split-K last as long as their busiest cluster, whose items
  come from the schedule model (`kernels/schedule_model.py`).
- Nothing beats the memory system: the bytes of A, B and the output (and of partial tiles)
  over the GPU's bandwidth is a floor. An operand that several cluster rows (columns) read is
  partly fetched from HBM again (`reread_fraction`); one that a single cluster row reads, as B
  is when a cluster spans all of a small M, streams once. Compute and memory overlap
  imperfectly, so the smaller of the two adds a fitted fraction `overlap_penalty` of itself
  (this also keeps configs that sit at the floor ranked by their compute).
- An operand whose contiguous mode is M or N gets the 128-byte shared-memory swizzle only when
  its tile spans a multiple of 64 elements along that mode; a narrower swizzle costs
  `NARROW_SWIZZLE_COST` of `a_f` (families are fitted with row-major a and b, whose B is
  N-major: a swapped config or another layout can gain or lose the narrow swizzle; one that
  gains the full swizzle takes `full_swizzle_constants`).
- Writing and summing partial tiles (split-K, stream-K) follows the mainloop, so their cost
  (`publish_us_per_kb`, `gather_us_per_kb`) adds to the time even when memory bounds it.
  Split-K's partials are written and read back by one wave and stay in L2: they add nothing
  to the HBM floor (charged there, they made an H100's floor rank 128x64 tiles split by 4
  ahead of 128x128 split by 8 on 512 x 512 x 32768, 42.5 against 37.1 µs measured).
  Stream-K's (`stream_k_*`) are measured, not fitted: a stream-K segment's partners finish
  when it does. A split-K wave also waits for its slowest split and the flag handshake
  (`split_k_wait_us`, fitted): a latency that does not grow with the tile, which a per-KB
  charge alone would overstate for large tiles.
`a_f` and `c_f` are fitted per family, by least squares, to measured data-parallel timings
(`benchmarks/fit_ranking.py` writes `calibration_<arch>.json` from
`benchmarks/results/timings-*.json.gz`): 16-bit inputs with B N-major (`families`), where a
width that is not a multiple of 64 where B gets the full swizzle takes them from the widths
around it (`full_swizzle_constants`). 8-bit problems take a family's `families_8bit` constants
where the calibration holds them (fitted to 8-bit timings, A and B K-major as their WGMMAs
read them), else the 16-bit family's: a k-tile is 128 bytes of K either way, twice the
elements at twice the MMA rate. The shipped calibration holds none: fits to fp8 timings
reordered the top k without a gain on the suites (`docs/ranking.md`).
A family without measurements falls back to the tile's MMA work at an efficiency that grows
with the tile. Raster order and swizzle are not modelled:
they are swept by timing, on binaries already compiled; a pick is first run in bands
(`in_first_order`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from importlib import resources

from gemmtune.core.config import Decomposition, GemmConfig, Raster, Schedule
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels import tile_k
from gemmtune.kernels.schedule_model import TileGrid, ceil_div, make_schedule
from gemmtune.kernels.sm90.rules import (
    ODD_EIGHT_TILE_NS,
    TILE_K_BYTES,
    WIDE_STAGE_K_BYTES,
    accumulator_registers,
    epi_tile,
)

#: `cutlass.utils.hopper_helpers.get_smem_layout_atom` gives an M- or N-major 16-bit operand a
#: 128-byte swizzle when its tile's contiguous extent is a multiple of 64 elements, else 64 or
#: 32 bytes (208: 32). WGMMA reads a narrower swizzle more slowly: each such operand costs
#: this fraction of the family's time per k-tile.
NARROW_SWIZZLE_COST = 0.05
SWIZZLE_ELEMENTS = 64  # 128 bytes of a 16-bit type
#: The layout the families are fitted on (`python -m benchmarks timings`): row-major a and b
#: for 16-bit inputs, both K-major for 8-bit ones.
FITTED_MAJORS = ("k", "n")
FITTED_MAJORS_8BIT = ("k", "k")
#: A stage 256 bytes deep in K loads each weight row in runs twice as long, and a kernel at the
#: memory floor streams its operands this much faster: 3-6 % on decode weights of 34-201 MB
#: with narrow tiles on an H100 (`docs/kernels.md`, serving shapes).
WIDE_STAGE_MEMORY_FACTOR = 0.96


def narrow_swizzles(
    config: GemmConfig, a_major: str | None, b_major: str | None, swap_ab: bool
) -> int:
    """How many of the kernel's operands get a swizzle narrower than 128 bytes, for a problem
    whose a and b have these majors, computed as it is (`swap_ab` False) or transposed."""
    a_mn, b_mn = a_major == "m", b_major == "n"
    if swap_ab:  # the kernel's A is b^T, its B is a^T
        a_mn, b_mn = b_mn, a_mn
    return int(a_mn and config.tile_m % SWIZZLE_ELEMENTS != 0) + int(
        b_mn and config.tile_n % SWIZZLE_ELEMENTS != 0
    )


#: The raster order and swizzle a config the model picks is first timed (and, untimed, run) at:
#: bands 8 clusters across, so that the tiles in flight share few rows of A and columns of B.
#: Plain column order (along M, swizzle 1) walks the whole resident grid down M where M is
#: long, and a tile that is fast in bands can time slow there and miss the tuner's final.
#: A compute-bound config whose work is one wave starts in plain column order instead
#: (`RankingModel.first_order`).
FIRST_RASTER, FIRST_SWIZZLE = Raster.ALONG_M, 8
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
    where it is narrower than every multiple of 16 that cuts the rows into as few tiles."""
    if config.tile_n not in ODD_EIGHT_TILE_NS:
        return True
    if not config.swap_ab or problem.m > ODD_EIGHT_MAX_ROWS:
        return False
    tiles = ceil_div(problem.m, config.tile_n)
    return config.tile_n < ceil_div(ceil_div(problem.m, tiles), 16) * 16


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


def stores_by_threads_beside_tma(config: GemmConfig, offered: dict | set) -> bool:
    """Whether `config` stores by threads where its TMA-store twin is offered too (an output
    TMA can store). `top_k` does not rank such a config: one warp stores asynchronously where
    every thread of a thread store waits for its own, and timed side by side they were never
    faster (0.5-5 % slower on 4096^3, equal on 128 x 6144 x 4096; `docs/kernels.md`), while
    their families, fitted on another day's timings than the TMA-store ones, put some ahead by
    more than `TIE_MARGIN`. They serve outputs TMA cannot store, where they are all there is."""
    return not config.tma_store and dataclasses.replace(config, tma_store=True) in offered


def in_first_order(config: GemmConfig) -> GemmConfig:
    """`config` at `FIRST_RASTER` and `FIRST_SWIZZLE` (the same binary)."""
    return config.with_runtime(raster=FIRST_RASTER, swizzle=FIRST_SWIZZLE)


@dataclass(frozen=True)
class DeviceModel:
    """What the model needs to know about a GPU."""

    sm_count: int = 132
    hbm_bytes_per_us: float = 4.3e6  # an H200's 4.3 TB/s; `for_gpu` takes 3.0 for an H100
    mma_flops_per_us_per_sm: float = 6.0e6  # ~790 TFLOP/s dense bf16 over 132 SMs
    resident_by_cluster_size: tuple[tuple[int, int], ...] = ((1, 132), (2, 66), (4, 30), (8, 15))

    def resident_clusters(self, cluster_size: int) -> int:
        table = dict(self.resident_by_cluster_size)
        if cluster_size in table:
            return table[cluster_size]
        return max(1, self.sm_count // cluster_size)

    @classmethod
    def for_gpu(cls, name: str, sm_count: int, resident: dict[int, int]) -> DeviceModel:
        """The model of a GPU by name. A B200's numbers are first principles until measured:
        8 TB/s, and 2.25 dense bf16 PFLOP/s at the ~80 % an H200 reaches of its 989."""
        bandwidth, flops_per_sm = 4.3e6, 790e6 / 132
        if "H100" in name:
            bandwidth = 3.0e6
        elif "B200" in name:
            bandwidth, flops_per_sm = 8.0e6, 0.8 * 2250e6 / 148
        return cls(
            sm_count=sm_count,
            hbm_bytes_per_us=bandwidth,
            mma_flops_per_us_per_sm=flops_per_sm,
            resident_by_cluster_size=tuple(sorted(resident.items())),
        )


def mma_time_factor(problem: GemmProblem) -> float:
    """The MMA time of the problem's work relative to 16-bit inputs: 8-bit WGMMAs multiply at
    twice the rate (1,979 dense TOPS on an H100/H200 against 989 TFLOP/s). A k-tile is 128
    bytes of K whatever the type, so its MMA time is the same for both."""
    return 0.5 if problem.a_dtype.itemsize == 1 else 1.0


def family(config: GemmConfig) -> str:
    """The key of the config's family: everything but the decomposition and runtime fields."""
    return _family_key(config, config.tile_n)


def _family_key(config: GemmConfig, tile_n: int) -> str:
    """The key of the family of `config` at another width."""
    cta = "_2cta" if config.two_cta else ""
    epi = "tma" if config.tma_store else "st"
    # a wider stage is a k-tile of more work: constants per k-tile are its own
    stage = f"_k{config.stage_k_bytes}" if config.stage_k_bytes != TILE_K_BYTES else ""
    return (
        f"{config.arch}_{config.tile_m}x{tile_n}_c{config.cluster_m}x{config.cluster_n}"
        f"{cta}_{config.schedule.value}_{epi}{stage}"
    )


def full_swizzle_constants(families: dict, config: GemmConfig) -> tuple[float, float] | None:
    """(a, c) of a family whose width is not a multiple of 64, where its B gets the 128-byte
    swizzle (K-major, as a linear layer's weight is, or any swapped config's), or None.
    Families are fitted with B N-major, where such a width gets a 64-byte (widths 32 mod 64)
    or 32-byte swizzle (16 mod 32), and WGMMA reads those slowly: fitted, a 64-row tile's
    k-tile takes ~1.3x and ~2x what the widths that are multiples of 64 around it take, and
    the fit of such a family splits its time between `a` and `c` unreliably. With the full
    swizzle both are taken linear in `tile_n` between those two widths of the same height,
    cluster, schedule and epilogue."""
    below = config.tile_n // SWIZZLE_ELEMENTS * SWIZZLE_ELEMENTS
    above = below + SWIZZLE_ELEMENTS
    low = families.get(_family_key(config, below))
    high = families.get(_family_key(config, above))
    if below == config.tile_n or low is None or high is None:
        return None
    w = (config.tile_n - below) / (above - below)
    return low[0] + w * (high[0] - low[0]), low[1] + w * (high[1] - low[1])


@functools.cache
def load_calibration(arch: str) -> dict:
    """The fitted constants shipped for `arch` ({} when there are none)."""
    try:
        text = resources.files("gemmtune.space").joinpath(f"calibration_{arch}.json").read_text()
    except FileNotFoundError:
        return {}
    return json.loads(text)


@dataclass(frozen=True)
class RankingModel:
    """Predicts a config's time (µs) for a problem on a device."""

    device: DeviceModel = DeviceModel()
    calibration: dict | None = None

    def _calibration(self, config: GemmConfig) -> dict:
        if self.calibration is not None:
            return self.calibration
        return load_calibration(config.arch)

    def fitted_families(self, config: GemmConfig, ab_bytes: int = 2) -> tuple[dict, tuple]:
        """The fitted families that describe `config` on inputs of `ab_bytes` bytes, and the
        majors of a and b they were timed with: the 8-bit ones where the calibration fits the
        config's family on 8-bit timings, else the 16-bit ones (8-bit timings need not cover
        every binary: those of the direct-store epilogue, say)."""
        calibration = self._calibration(config)
        eight_bit = calibration.get("families_8bit", {})
        if ab_bytes == 1 and family(config) in eight_bit:
            return eight_bit, FITTED_MAJORS_8BIT
        return calibration.get("families", {}), FITTED_MAJORS

    def constants(self, config: GemmConfig, ab_bytes: int = 2) -> tuple[float, float, float, float]:
        """(a: µs per k-tile, c: µs per item, publish: µs per partial written, gather: µs per
        partial read) for the config's family on inputs of `ab_bytes` bytes."""
        return self._constants(config, self.fitted_families(config, ab_bytes)[0])

    def _constants(self, config: GemmConfig, families: dict) -> tuple[float, float, float, float]:
        """`constants` from the fitted `families` that describe the problem's inputs."""
        calibration = self._calibration(config)
        fitted = families.get(family(config))
        tile_kb = config.tile_m * config.tile_n * 4 / 1024
        prefix = "stream_k_" if config.decomposition is Decomposition.STREAM_K else ""
        publish = calibration.get(prefix + "publish_us_per_kb", 0.012) * tile_kb
        gather = calibration.get(prefix + "gather_us_per_kb", 0.012) * tile_kb
        if fitted is not None:
            return fitted[0], fitted[1], publish, gather
        return (*self._analytic(config), publish, gather)

    def _analytic(self, config: GemmConfig) -> tuple[float, float]:
        """An unmeasured family: the MMA work of a k-tile at an efficiency that grows with the
        tile (bigger tiles reuse operands more), and an epilogue that writes the tile."""
        rows = config.tile_m // (2 if config.two_cta else 1)
        flops = 2 * rows * config.tile_n * (config.stage_k_bytes // 2)  # 16-bit inputs
        efficiency = 0.92 * (1 - 16 / config.tile_n) * min(1.0, rows / 128) ** 0.25
        a = flops / (self.device.mma_flops_per_us_per_sm * max(efficiency, 0.2))
        c = 1.0 + rows * config.tile_n * 2 / 20e3
        if config.schedule is Schedule.PINGPONG:
            c *= 0.3  # the other warpgroup's mainloop hides most of it
        return a, c

    def predict_us(self, problem: GemmProblem, config: GemmConfig) -> float:
        calibration = self._calibration(config)
        families, fitted_majors = self.fitted_families(config, problem.a_dtype.itemsize)
        a, c, publish, gather = self._constants(config, families)
        narrow = narrow_swizzles(config, problem.a_major, problem.b_major, config.swap_ab)
        fitted_narrow = narrow_swizzles(config, *fitted_majors, swap_ab=False)
        full = full_swizzle_constants(families, config) if fitted_narrow and not narrow else None
        if full is not None:
            a, c = full
        else:
            a *= (1 + NARROW_SWIZZLE_COST) ** (narrow - fitted_narrow)
        ctas = config.cluster_m * config.cluster_n
        cta_tile = config.tile_m // config.cta_group * config.tile_n  # outputs one CTA holds
        resident = self.device.resident_clusters(ctas)
        grid = TileGrid.of(config, problem.m, problem.n, problem.l)
        k_tiles = ceil_div(problem.k, tile_k(config, problem.a_dtype.itemsize))
        units = grid.work_units
        if config.decomposition is Decomposition.DATA_PARALLEL:
            compute = ceil_div(units, resident) * (a * k_tiles + c)
            partial_bytes, reduction = 0, 0.0
        elif config.decomposition is Decomposition.SPLIT_K:
            schedule = make_schedule("split_k", grid, k_tiles, resident, splits=config.splits)
            splits = schedule.effective_splits
            waves = ceil_div(units * splits, schedule.grid_clusters)
            # the busiest cluster: its items, each a split's k-tiles; each split publishes its
            # partial, waits for the others and reads a 1/splits share of every split's: one
            # tile's worth
            wait = calibration.get("split_k_wait_us", 0.0)
            reduction = waves * (wait + publish + gather) if splits > 1 else 0.0
            compute = waves * (a * ceil_div(k_tiles, splits) + c)
            # written and read back by the same wave, the partials stay in L2 (Nsight Compute,
            # 512 x 512 x 32768 split by 4 and by 8 on an H100: 4 and 8 MB of partials
            # written, 2.4 MB reached HBM, the output's 0.5 MB among them)
            partial_bytes = 0
        else:
            schedule = make_schedule("stream_k", grid, k_tiles, resident)
            dp_waves = schedule.dp_units // resident
            iterations = ceil_div(schedule.sk_iterations, max(schedule.sk_clusters, 1))
            spans = ceil_div(iterations, k_tiles) + (iterations % k_tiles != 0)
            per_unit = ceil_div(k_tiles, max(iterations, 1))
            shared = publish + gather * per_unit if schedule.sk_units else 0.0
            sk_items = min(spans, 2 if schedule.sk_units else 0)
            compute = dp_waves * (a * k_tiles + c) + a * iterations + c * sk_items
            reduction = shared * sk_items
            partial_bytes = 8 * schedule.partial_slots * ctas * cta_tile
        out_bytes = problem.m * problem.n * problem.l * problem.out_dtype.itemsize
        # an operand that several cluster rows (columns) read is partly fetched again from
        # HBM; one that a single cluster row reads (e.g. B when the cluster spans all of M) is
        # streamed once and multicast (the kernel's A and B: b and a for a swap_ab config)
        reread = calibration.get("reread_fraction", 0.0)
        a_reads = 1.0 + reread * (grid.clusters_n > 1)
        b_reads = 1.0 + reread * (grid.clusters_m > 1)
        in_bytes = (grid.m * a_reads + grid.n * b_reads) * problem.k * problem.l
        in_bytes *= problem.a_dtype.itemsize
        memory = (in_bytes + out_bytes + partial_bytes) / self.device.hbm_bytes_per_us
        penalty = calibration.get("overlap_penalty", 0.0)
        # the partial tiles are written and summed after the mainloop: nothing hides them
        # wide stages lower the floor where it binds, nothing else
        floor = memory * (WIDE_STAGE_MEMORY_FACTOR if config.stage_k_bytes > TILE_K_BYTES else 1)
        return max(compute, floor) + penalty * min(compute, memory) + reduction

    def _roofline_parts(self, problem: GemmProblem) -> tuple[float, float]:
        """(µs of the problem's MMA work at peak, µs to move its operands and result once)."""
        compute = problem.flops / (self.device.sm_count * self.device.mma_flops_per_us_per_sm)
        compute *= mma_time_factor(problem)
        elements = (problem.m + problem.n) * problem.k * problem.a_dtype.itemsize
        memory = (elements + problem.m * problem.n * problem.out_dtype.itemsize) * problem.l
        return compute, memory / self.device.hbm_bytes_per_us

    def roofline_us(self, problem: GemmProblem) -> float:
        """The least time the GPU needs for the problem: its MMA work at peak, or moving its
        operands and result once, whichever is longer."""
        return max(self._roofline_parts(problem))

    def memory_bound(self, problem: GemmProblem) -> bool:
        """Whether moving the problem's bytes once takes longer than its MMA work at peak."""
        compute, memory = self._roofline_parts(problem)
        return memory >= compute

    def rank(
        self, problem: GemmProblem, configs: list[GemmConfig]
    ) -> list[tuple[float, GemmConfig]]:
        """(predicted µs, config) from fastest to slowest; ties keep the input order."""
        scored = [(self.predict_us(problem, c), i, c) for i, c in enumerate(configs)]
        scored.sort(key=lambda x: (x[0], x[1]))
        return [(t, c) for t, _, c in scored]

    def top_k(self, problem: GemmProblem, configs: list[GemmConfig], k: int) -> list[GemmConfig]:
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
        defaults = [
            c
            for c in configs
            if c.raster is Raster.ALONG_M
            and c.swizzle == 1
            and not stores_by_threads_beside_tma(c, offered)
            and fits_rows(c, problem)
        ]
        ranked = self.rank(problem, defaults)
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
        top = list(dict.fromkeys(self._once_twin(problem, c, predicted) for c in top))
        extra = [
            *self._unpadded_twins(problem, top, offered),
            self._reads_once_pick(problem, ranked, top),
            self._pingpong_pick(problem, ranked, top),
        ]
        return [*top, *(c for c in dict.fromkeys(extra) if c is not None and c not in top)]

    def _unpadded_twins(
        self, problem: GemmProblem, top: list[GemmConfig], offered: set[GemmConfig]
    ) -> list[GemmConfig]:
        """For a compute-bound problem, the transposed cluster shape of each data-parallel
        config of `top` in a cluster of `PADDED_CLUSTER_CTAS` that `pads_cluster`, where
        `offered` holds it and it pads nothing."""
        if self.memory_bound(problem):
            return []
        found = []
        for config in top:
            if (
                config.decomposition is not Decomposition.DATA_PARALLEL
                or config.cluster_m * config.cluster_n != PADDED_CLUSTER_CTAS
                or not pads_cluster(config, problem)
            ):
                continue
            twin = dataclasses.replace(
                config, cluster_m=config.cluster_n, cluster_n=config.cluster_m
            )
            if twin in offered and not pads_cluster(twin, problem):
                found.append(twin)
        return found

    def _pingpong_pick(
        self, problem: GemmProblem, ranked: list[tuple[float, GemmConfig]], top: list[GemmConfig]
    ) -> GemmConfig | None:
        """For a compute-bound 8-bit problem where `top` holds no data-parallel ping-pong tile
        of `EIGHT_BIT_PINGPONG_REGISTERS` accumulators per thread in a cluster of two
        (unswapped, TMA store), the one predicted fastest of more tiles than SMs; else None."""
        if problem.a_dtype.itemsize != 1 or self.memory_bound(problem):
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
            (c for _, c in ranked if small_pingpong(c) and self.tiles_per_sm(problem, c) > 1),
            None,
        )

    def _once_twin(
        self, problem: GemmProblem, config: GemmConfig, offered: dict[GemmConfig, float]
    ) -> GemmConfig:
        """`config`, or where the problem is `skewed` and `config` is data-parallel, of one
        wave and does not read the larger operand once, its twin in the cluster shape of
        fewest CTAs that does and stays one wave, where `offered` holds it (`ONCE_TWIN_SHAPES`)."""
        if (
            config.decomposition is not Decomposition.DATA_PARALLEL
            or not skewed(problem)
            or reads_larger_once(config, problem)
            or not self.one_wave(problem, config)
        ):
            return config
        for cluster_m, cluster_n in ONCE_TWIN_SHAPES:
            twin = dataclasses.replace(config, cluster_m=cluster_m, cluster_n=cluster_n)
            if (
                twin in offered
                and reads_larger_once(twin, problem)
                and self.one_wave(problem, twin)
            ):
                return twin
        return config

    def tiles_per_sm(self, problem: GemmProblem, config: GemmConfig) -> float:
        """The config's output tiles (those of its clusters' units) over the GPU's SMs."""
        grid = TileGrid.of(config, problem.m, problem.n, problem.l)
        ctas = config.cluster_m * config.cluster_n
        return grid.work_units * ctas / self.device.sm_count

    def first_order(self, problem: GemmProblem, config: GemmConfig) -> GemmConfig:
        """`config` at the order the tuner first times it in: `in_first_order`, but for a
        compute-bound problem's data-parallel config whose work is one wave, plain column
        order. Every tile then runs at once and bands keep nothing in L2 that plain order would
        not; the order only decides which clusters run side by side, and clusters that walk
        down M beside each other (each on its own rows of A) ran faster than clusters in bands
        of 8 along M (each band's clusters on one row of A): on an H200, bf16 777 x 3584 x 3584
        in swapped 256x88 tiles 31.2 against 37.9 µs (the first pass then left the binary out
        of the final for a 64x200 one at 33.5), 2048 x 1024 x 8192 in 128x128 tiles in
        clusters of 2x1 47.0 against 52.7 (`docs/tuning.md`). Split-K keeps bands: a unit's
        splits run on neighbouring clusters either way, and its small problems' picks timed
        1-3 % apart between orders, no faster in plain order."""
        if (
            config.decomposition is Decomposition.DATA_PARALLEL
            and not self.memory_bound(problem)
            and self.one_wave(problem, config)
        ):
            return config.with_runtime(raster=Raster.ALONG_M, swizzle=1)
        return in_first_order(config)

    def one_wave(self, problem: GemmProblem, config: GemmConfig) -> bool:
        """Whether the config's work (its units, times its splits) fits in one wave of the
        clusters the GPU holds at once."""
        grid = TileGrid.of(config, problem.m, problem.n, problem.l)
        resident = self.device.resident_clusters(config.cluster_m * config.cluster_n)
        return grid.work_units * config.splits <= resident

    def _reads_once_pick(
        self, problem: GemmProblem, ranked: list[tuple[float, GemmConfig]], top: list[GemmConfig]
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
