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
they are swept by timing, on binaries already compiled; a pick is first run in the order
`RankingModel.first_order` gives it. Which of the ranked configs the tuner times is
`space/shortlist.py`'s (`RankingModel.top_k`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from gemmtune.core.config import Decomposition, GemmConfig, Raster, Schedule
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels import tile_k
from gemmtune.kernels.schedule_model import TileGrid, ceil_div, make_schedule
from gemmtune.kernels.sm90.rules import ODD_EIGHT_TILE_NS, TILE_K_BYTES
from gemmtune.space import shortlist

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
    cluster, schedule and epilogue. A width of `rules.ODD_EIGHT_TILE_NS` under 64 takes the
    64-wide family's scaled to its width (its MMAs' work, and its epilogue's, are in
    proportion), as if a zero-wide family cost nothing: the analytic fallback, made for the
    narrow decode tiles, priced 64x56 above 64x64."""
    below = config.tile_n // SWIZZLE_ELEMENTS * SWIZZLE_ELEMENTS
    above = below + SWIZZLE_ELEMENTS
    scaled_down = below == 0 and config.tile_n in ODD_EIGHT_TILE_NS
    low = (0.0, 0.0) if scaled_down else families.get(_family_key(config, below))
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
        """The configs the tuner times first: `shortlist.top_k` on this model."""
        return shortlist.top_k(self, problem, configs, k)

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
