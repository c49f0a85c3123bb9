"""What the Hopper kernel implements, what it can serve, and how it spends shared memory.

Plain Python, importable without the DSL: the kernel reads its stage counts and epilogue tile
from here, and the search space asks here which configs are valid. There is no second copy
of these rules anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gemmtune.core.config import (
    STAGE_K_BYTES,
    Decomposition,
    GemmConfig,
    Schedule,
    expand_families,
)
from gemmtune.kernels import serve_reason
from gemmtune.kernels.signature import KernelSignature

if TYPE_CHECKING:
    from gemmtune.core.problem import GemmProblem

#: Shared memory one CTA may use on sm_90 (227 KB), `cutlass.utils.get_smem_capacity_in_bytes`.
SMEM_CAPACITY = 232448
#: Kept back for mbarriers and alignment padding.
SMEM_RESERVED = 1024
#: K extent of a tile in bytes by default: one 128-byte swizzle atom of a K-major row, four
#: WGMMAs (k16 for 16-bit types, k32 for 8-bit ones)
TILE_K_BYTES = STAGE_K_BYTES[0]


def tile_k(ab_bytes: int, stage_k_bytes: int = TILE_K_BYTES) -> int:
    """K extent of a tile (one pipeline stage) in elements of `ab_bytes` bytes: by default 64
    16-bit ones, 128 8-bit ones; twice that in a 256-byte stage."""
    return stage_k_bytes // ab_bytes


THREADS_PER_WARPGROUP = 128
#: 32-bit registers of one SM, all of them for the one CTA it holds.
REGISTER_FILE = 65536
#: Registers a consumer thread needs besides its accumulators (addressing, the epilogue's
#: conversion, the pipeline state) so as not to spill.
CONSUMER_OVERHEAD_REGISTERS = 32
#: What a promoted fp8 consumer needs besides its register tiles where no split-K sum scatters
#: partials and TMA stores the tile: three tiles of 72 (128x144 cooperative, 64x144 ping-pong)
#: compile without spills in 240 registers in every scaling and output type, data-parallel or
#: stream-K; split-K or thread stores beside them spill (2-71 local-memory operations).
LEAN_PROMOTED_OVERHEAD_REGISTERS = 24
#: Split-K's scattered sum needs registers beyond the accumulators: its tiles spill above this
#: many accumulator registers per thread.
SPLIT_K_MAX_ACCUMULATOR_REGISTERS = 160
#: Thread stores (`epilogue.StagedEpilogue` without TMA) spill beside this many accumulator
#: registers or more in a ping-pong tile (128x176-128x208: 2-66 local-memory operations) and in
#: a cooperative stream-K one (256x176, 256x208: 2-6); cooperative data-parallel tiles do not.
THREAD_STORE_SPILLING_REGISTERS = 176
#: Accumulator registers from which a tile shared between items spills with the grouped
#: epilogue, so those keep at most four buffers and store one sub-tile per barrier.
STREAM_K_GROUPED_EPILOGUE_SPILLS = 192
#: Registers one WGMMA instruction needs besides its accumulators. ptxas grants a single
#: instruction no more than the launch's share (65536 / threads, whatever `setmaxnreg` gives
#: later), so wide tiles cannot run with three consumer warpgroups.
WGMMA_OVERHEAD_REGISTERS = 26

# 192 = three 64-row warpgroups (192x192 tiles cut a 2048x2304 output into 132 tiles)
TILE_M_BY_SCHEDULE = {Schedule.COOPERATIVE: (128, 192, 256), Schedule.PINGPONG: (64, 128)}
#: Narrow tiles, for decode batches: swapped, a batch of 1-16 rows (32, 48) is one WGMMA's N,
#: and a stage is almost all weight (128x16: 16 KB of weight, 2 KB of activations), so more of
#: the shared memory holds weight bytes in flight than with a 64-wide tile mostly zero-filled.
NARROW_TILE_NS = (16, 32, 48)
#: The ranking model's families are fitted from this width up; narrower ones are analytic.
FITTED_MIN_TILE_N = 64
# multiples of 32; 144 (2304 = 16 x 144: 128 tiles of 256x144 fill 132 SMs where 256x160
# leaves 12 idle and wastes most of a column of tiles); 208, as a swapped tile 208 rows of the
# output tall (4096 x 28672 in 256x208 c1x2 swapped tiles: 1120 cluster units, 16.97 rounds
# of 66 clusters, where 128x256's 1792 units need 28); 80, 112 and 176, so that a ragged side
# of a few hundred rows splits into few tiles with little padding, one wave of tiles in all
# (a 640 x 1800 output in 128x80 swapped tiles: 15 x 8 = 120; 333 rows in two 176-wide ones)
#: Widths of an odd number of 8-column blocks, for fp8 and 16-bit inputs: cuBLAS and
#: cuBLASLt fit a swapped tile's width to a batch of a few hundred rows in steps of 8 (H200,
#: torch profiler: 777 x 3584 x 3584 in tiles 88 rows wide, nine for 777 rows and 126 tiles in
#: one wave; 300 rows in three of 104, 200 in one of 200), where widths in steps of 16 or 32
#: leave a wave part empty or pad the rows by 7-15 %. int8 WGMMAs take N = 8, 16, 24 or 32 and
#: then multiples of 16 only (`signature_reason`).
ODD_EIGHT_TILE_NS = (56, 88, 104, 152, 168, 200)
TILE_N_CHOICES = tuple(
    sorted((*NARROW_TILE_NS, *range(64, 257, 32), 80, 112, 144, 176, 208, *ODD_EIGHT_TILE_NS))
)
CLUSTER_SHAPES = ((1, 1), (2, 1), (1, 2), (2, 2), (1, 4), (4, 1))
#: Stages 256 bytes deep in K, for narrow tiles only: a decode GEMM streams its weight, and
#: loads of 256 bytes of each weight row read it faster than loads of 128 (16 x 6144 x 16384,
#: swapped 128x16 tiles: 72.7 against 77.6 µs on an H100; docs/kernels.md). Wider tiles are
#: bound by their MMAs or their L2 traffic, where half the stages would cost more than the
#: longer runs win.
WIDE_STAGE_K_BYTES = STAGE_K_BYTES[1]
#: The fewest stages a wide-stage tile must keep (a narrow 128-byte one keeps 10 to 22)
MIN_WIDE_STAGES = 4
EPI_TILE_N = 32
MIN_AB_STAGES = 2


@dataclass(frozen=True)
class SmemPlan:
    """How one CTA's shared memory is split between the A/B pipeline and the epilogue."""

    ab_stages: int
    epi_stages: int
    ab_stage_bytes: int
    epi_stage_bytes: int
    epi_group: int = 1  # sub-tiles the epilogue stores per barrier, at most
    vector_bytes: int = 0  # scales and bias of the tiles in flight (`vector_buffer_bytes`)

    @property
    def total_bytes(self) -> int:
        return (
            self.ab_stages * self.ab_stage_bytes
            + self.epi_stages * self.epi_stage_bytes
            + self.vector_bytes
            + SMEM_RESERVED
        )


def consumer_warpgroups(config: GemmConfig) -> int:
    """WGMMA warpgroups per CTA: three for a 192-row cooperative tile (64 rows each), else two."""
    return 3 if config.schedule is Schedule.COOPERATIVE and config.tile_m == 192 else 2


def register_split(config: GemmConfig, register_tiles: int = 1) -> tuple[int, int]:
    """Registers per thread of the producer and of the consumers after `setmaxnreg`, for
    consumers holding `register_tiles` tiles of accumulators (promoted fp8 holds partial sums
    beside them, `promoted_register_tiles`): the producer keeps little (24 is the least
    allowed, taken where three consumers, or two holding 208 registers of tiles or more, need
    it) and the consumers share the rest, in multiples of 8."""
    consumers = consumer_warpgroups(config)
    tile_registers = register_tiles * accumulator_registers(config)
    producer = 40 if consumers == 2 and tile_registers < 208 else 24
    per_row = REGISTER_FILE // THREADS_PER_WARPGROUP
    return producer, (per_row - producer) // consumers // 8 * 8


def mma_tile_m(config: GemmConfig) -> int:
    """Rows one MMA pass covers: all consumer warpgroups (cooperative) or one (ping-pong),
    64 each."""
    if config.schedule is Schedule.COOPERATIVE:
        return 64 * consumer_warpgroups(config)
    return 64


def accumulator_registers(config: GemmConfig) -> int:
    """fp32 accumulator registers each consumer thread holds for its (share of a) tile."""
    rows_per_warpgroup = config.tile_m
    if config.schedule is Schedule.COOPERATIVE:
        rows_per_warpgroup //= consumer_warpgroups(config)
    return rows_per_warpgroup * config.tile_n // THREADS_PER_WARPGROUP


def max_accumulator_registers(config: GemmConfig, register_tiles: int = 1) -> int:
    """Registers a consumer thread may give its `register_tiles` tiles of accumulators."""
    return register_split(config, register_tiles)[1] - CONSUMER_OVERHEAD_REGISTERS


def promotion_buffers(config: GemmConfig) -> int:
    """Register tiles of partial sums a promoted fp8 binary keeps beside its accumulators
    (`mainloop.mma_tile_promoted`): four for two-step stages where five tiles fit a consumer's
    registers (one stage's two steps run while the other's sums are added), two where three
    fit (one step runs while the other is added; beside TMA stores without split-K, three
    tiles need `LEAN_PROMOTED_OVERHEAD_REGISTERS` more), else one (`signature_reason` refuses
    tiles where two do not fit)."""
    regs = accumulator_registers(config)
    if promotion_steps(config) == 2 and 5 * regs <= max_accumulator_registers(config, 5):
        return 4
    lean = config.tma_store and config.decomposition is not Decomposition.SPLIT_K
    overhead = LEAN_PROMOTED_OVERHEAD_REGISTERS if lean else CONSUMER_OVERHEAD_REGISTERS
    return 2 if 3 * regs <= register_split(config, 3)[1] - overhead else 1


def promoted_register_tiles(config: GemmConfig) -> int:
    """Tiles of fp32 registers a promoted fp8 binary's consumer holds: its accumulators and
    `promotion_buffers` tiles of partial sums."""
    return 1 + promotion_buffers(config)


def promotion_steps(config: GemmConfig) -> int:
    """Promotion steps per A/B stage of a promoted fp8 binary: it adds the tensor cores' sums
    into fp32 every `TILE_K_BYTES` elements (one byte each), so a 256-byte stage takes two."""
    return config.stage_k_bytes // TILE_K_BYTES


def epi_tile(config: GemmConfig) -> tuple[int, int]:
    """The sub-tile the epilogue moves at a time: one MMA pass tall, 32 columns wide (16
    when 32 does not divide the tile, 8 when 16 does not)."""
    for width in (EPI_TILE_N, 16):
        if config.tile_n % width == 0:
            return mma_tile_m(config), width
    return mma_tile_m(config), 8


def row_bias_in_registers(config: GemmConfig, signature: KernelSignature) -> bool:
    """Whether each thread holds the bias of its own accumulator rows in registers rather than
    reading a shared buffer: a swapped binary (the bias runs along the tile's rows, 2-4 values
    per thread) whose tiles are summed whole (data-parallel, stream-K through an owner). A
    shared-memory read of the row's term before the epilogue made ptxas spill every packed
    output pair of swapped tiles from 176 accumulators (`bias_register_limit`); split-K
    shares, whose values the reduction spreads over other threads, read the buffer."""
    return signature.bias and config.swap_ab and config.decomposition is not Decomposition.SPLIT_K


def vector_buffer_bytes(config: GemmConfig, signature: KernelSignature) -> int:
    """Shared memory for the vectors of a tile copied there while its mainloop runs, one
    buffer per consumer group (two for ping-pong, whose warpgroups hold tiles of their own):
    per-row fp8 scales (`kernels/scaling.py`, the tile's row and column scales) and a bias
    (`kernels/bias.py`, the tile's side along the output's columns: its rows in a swapped
    binary, unless held in registers: `row_bias_in_registers`), all fp32."""
    length = 0
    if signature.scaling == "row":
        length += config.tile_m + config.tile_n
    if signature.bias and not row_bias_in_registers(config, signature):
        length += config.tile_m if config.swap_ab else config.tile_n
    groups = 1 if config.schedule is Schedule.COOPERATIVE else 2
    return groups * length * 4


def smem_plan(config: GemmConfig, signature: KernelSignature) -> SmemPlan:
    """Stage counts from the shared-memory budget: the epilogue's buffers first, then as many
    A/B stages as fit in the rest, then what those leave to more epilogue buffers."""
    ab_stage_bytes = (config.tile_m + config.tile_n) * config.stage_k_bytes
    vector_bytes = vector_buffer_bytes(config, signature)
    capacity = SMEM_CAPACITY - SMEM_RESERVED - vector_bytes

    def ab_stages(epi_stages: int, epi_stage_bytes: int) -> int:
        return (capacity - epi_stages * epi_stage_bytes) // ab_stage_bytes

    epi_m, epi_n = epi_tile(config)
    epi_stage_bytes = epi_m * epi_n * signature.out_bytes
    subtiles = (config.tile_m // epi_m) * (config.tile_n // epi_n)
    # two at least, so that a tile of one sub-tile (a narrow one) never waits for the last
    # tile's store
    epi_stages = min(max(subtiles, 2), 4 if signature.out_bytes == 2 else 2)
    # two buffers where four would cost an A/B stage: the stage is worth more
    if epi_stages > 2 and ab_stages(2, epi_stage_bytes) > ab_stages(epi_stages, epi_stage_bytes):
        epi_stages = 2
    stages = ab_stages(epi_stages, epi_stage_bytes)
    tiles_shared = config.decomposition is not Decomposition.DATA_PARALLEL
    if tiles_shared and accumulator_registers(config) >= STREAM_K_GROUPED_EPILOGUE_SPILLS:
        return SmemPlan(
            stages, epi_stages, ab_stage_bytes, epi_stage_bytes, vector_bytes=vector_bytes
        )
    # What the A/B stages leave goes to more buffers, up to two tiles' worth, and the epilogue
    # stores its sub-tiles in groups, one barrier and one fence per group. Two groups and one
    # store more fit the buffers, so that claiming a group's buffers never waits for the
    # stores just issued.
    spare = capacity - stages * ab_stage_bytes
    epi_stages = max(epi_stages, min(2 * subtiles, spare // epi_stage_bytes))
    group = max(1, (epi_stages - 1) // 2)
    return SmemPlan(
        stages, epi_stages, ab_stage_bytes, epi_stage_bytes, group, vector_bytes=vector_bytes
    )


def implements(config: GemmConfig) -> str | None:
    """Why the Hopper kernel cannot be built for `config`, or None when it can."""
    if config.arch != "sm_90":
        return f"the Hopper kernel compiles for sm_90, not {config.arch}"
    allowed_m = TILE_M_BY_SCHEDULE[config.schedule]
    if config.tile_m not in allowed_m:
        return f"{config.schedule.value} tiles have tile_m in {allowed_m}, not {config.tile_m}"
    if config.tile_n not in TILE_N_CHOICES:
        return f"tile_n must be one of {TILE_N_CHOICES}, not {config.tile_n}"
    if (config.cluster_m, config.cluster_n) not in CLUSTER_SHAPES:
        return f"cluster {config.cluster_m}x{config.cluster_n} is not one of {CLUSTER_SHAPES}"
    threads = (1 + consumer_warpgroups(config)) * THREADS_PER_WARPGROUP
    wgmma_registers = 64 * config.tile_n // THREADS_PER_WARPGROUP + WGMMA_OVERHEAD_REGISTERS
    if wgmma_registers > REGISTER_FILE // threads:
        return (
            f"an m64n{config.tile_n} WGMMA needs {wgmma_registers} registers per thread, more "
            f"than a launch of {threads} threads has ({REGISTER_FILE // threads})"
        )
    regs = accumulator_registers(config)
    if regs > max_accumulator_registers(config):
        return (
            f"a {config.tile_m}x{config.tile_n} {config.schedule.value} tile needs {regs} "
            f"accumulator registers per thread, more than {max_accumulator_registers(config)}"
        )
    if config.decomposition is Decomposition.SPLIT_K and regs > SPLIT_K_MAX_ACCUMULATOR_REGISTERS:
        return (
            f"split-K's reduction spills with {regs} accumulator registers per thread (at most "
            f"{SPLIT_K_MAX_ACCUMULATOR_REGISTERS})"
        )
    if config.tile_n in ODD_EIGHT_TILE_NS and not config.tma_store:
        return f"tiles {config.tile_n} wide store through TMA only"
    if config.tile_n in ODD_EIGHT_TILE_NS and config.decomposition is Decomposition.STREAM_K:
        # compiled for fp8: 192x104 spilled 4 local-memory operations, 256x200 2
        return f"stream-K's epilogue spills with {config.tile_n}-wide tiles of 8-column sub-tiles"
    if (
        not config.tma_store
        and regs >= THREAD_STORE_SPILLING_REGISTERS
        and (config.schedule is Schedule.PINGPONG or config.decomposition is Decomposition.STREAM_K)
    ):
        return (
            f"thread stores spill beside {regs} accumulator registers per thread "
            f"({config.schedule.value}, {config.decomposition.value})"
        )
    plan = smem_plan(config, KernelSignature(out_dtype="fp32"))
    if plan.ab_stages < MIN_AB_STAGES:
        return f"only {plan.ab_stages} A/B stages fit in shared memory"
    if config.stage_k_bytes == WIDE_STAGE_K_BYTES:
        if config.tile_n not in NARROW_TILE_NS:
            return f"wide stages are for narrow tiles (tile_n in {NARROW_TILE_NS})"
        if plan.ab_stages < MIN_WIDE_STAGES:
            return f"only {plan.ab_stages} stages of {WIDE_STAGE_K_BYTES} bytes in K fit"
    return None


def implemented_configs(
    decompositions: tuple[Decomposition, ...] = (Decomposition.DATA_PARALLEL,),
) -> list[GemmConfig]:
    """Every config the kernel implements with `decompositions`, runtime fields at their
    defaults (a split-K config at 2 splits)."""
    families = [
        {
            "tile_m": tile_m,
            "tile_n": tile_n,
            "cluster_m": cluster_m,
            "cluster_n": cluster_n,
            "schedule": schedule,
            "tma_store": tma_store,
            "stage_k_bytes": stage_k_bytes,
        }
        for schedule, tile_ms in TILE_M_BY_SCHEDULE.items()
        for tile_m in tile_ms
        for tile_n in TILE_N_CHOICES
        for cluster_m, cluster_n in CLUSTER_SHAPES
        for tma_store in (True, False)
        for stage_k_bytes in (TILE_K_BYTES, WIDE_STAGE_K_BYTES)
    ]
    return [c for c in expand_families(families, decompositions) if implements(c) is None]


#: Tiles that spill with a batch dimension although their accumulators are few (three
#: consumer warpgroups at 160 registers each).
BATCHED_SPILLING_TILES = frozenset({(192, 144), (192, 160)})


def signature_reason(config: GemmConfig, signature: KernelSignature) -> str | None:
    """Why `config`'s binary for the problems of `signature` (swapped for a `swap_ab` config)
    would not build, spill or compute otherwise than it should, or None: a width of
    `ODD_EIGHT_TILE_NS` for int8 inputs; promoted fp8 accumulation with
    two register tiles beyond what a consumer holds; more than 192 accumulator registers with a
    batch index to carry, `BATCHED_SPILLING_TILES`, a bias from `bias_register_limit`
    registers, and thread stores (no TMA) from
    `thread_store_register_limit` registers or more. The compile test of every signature
    checks these limits."""
    built_for = signature.swapped() if config.swap_ab else signature
    if config.tile_n in ODD_EIGHT_TILE_NS and built_for.ab_dtype == "int8":
        return f"int8 WGMMAs have no N of {config.tile_n} (ODD_EIGHT_TILE_NS)"
    regs = accumulator_registers(config)
    if built_for.promoted and 2 * regs > max_accumulator_registers(config, 2):
        return (
            f"promoted accumulation holds a promotion step's partial sums beside the accumulators: "
            f"2 x {regs} registers per thread, more than {max_accumulator_registers(config, 2)}"
        )
    if built_for.batched and regs > 192:
        return f"{regs} accumulator registers per thread spill with a batch dimension"
    if built_for.batched and (config.tile_m, config.tile_n) in BATCHED_SPILLING_TILES:
        return f"{config.tile_m}x{config.tile_n} tiles spill with a batch dimension"
    limit = bias_register_limit(config, built_for)
    if limit is not None and regs >= limit:
        return f"{regs} accumulator registers spill beside a bias"
    limit = thread_store_register_limit(built_for)
    if not config.tma_store and limit is not None and regs >= limit:
        return f"{regs} accumulator registers spill in thread stores to this output"
    return None


def bias_register_limit(config: GemmConfig, signature: KernelSignature) -> int | None:
    """Accumulator registers per thread from which a binary with a bias spills, or None where
    it does not. Compiled on the CPU, every tile of 64 accumulators or more in every
    decomposition, swapped or not, bf16 and fp8 per tensor, per row and promoted:
    - swapped tiles summed whole hold their rows' terms in registers
      (`row_bias_in_registers`): with a TMA store none spill but 192-row stream-K tiles, from
      88 (4 local-memory operations at 192x176); with thread stores the limits below. (Read
      from a shared buffer instead, the terms made swapped tiles spill from 176: 4 at 128x176
      ping-pong, 48-89 from 192.)
    - beside per-row fp8 scales: swapped with the terms in registers from 176 (10-209), with
      thread stores from 104 (2 at 64x208 ping-pong stream-K, 13-214 from 144); swapped split-K
      from 128, with thread stores from 64; not swapped from 160 (14-21 at 128x160 ping-pong
      split by K, 256x176 cooperative stream-K, 128x192 and 256x200), with thread stores from
      96 (2 at 128x208 stream-K and 128x224);
    - with thread stores, 192-row tiles from 64 (4-24: 192x128 cooperative split by K, 88-96
      data-parallel), other split-K tiles from 96 (8-12: 128x192 and 128x208 cooperative,
      64x224 ping-pong), the rest from 144 (6-127: 128x144 ping-pong, 256x160-256x208)."""
    if not signature.bias:
        return None
    limits = []
    in_registers = row_bias_in_registers(config, signature)
    if signature.scaling == "row":
        if in_registers:
            limits.append(176 if config.tma_store else 104)
        elif config.swap_ab:
            limits.append(128 if config.tma_store else 64)
        else:
            limits.append(160 if config.tma_store else 96)
    elif (
        in_registers
        and consumer_warpgroups(config) == 3
        and config.decomposition is Decomposition.STREAM_K
    ):
        limits.append(88)
    if not config.tma_store:
        if consumer_warpgroups(config) == 3:
            limits.append(64)
        elif config.decomposition is Decomposition.SPLIT_K:
            limits.append(96)
        else:
            limits.append(144)
    return min(limits, default=None)


def thread_store_register_limit(signature: KernelSignature) -> int | None:
    """Accumulator registers per thread from which thread stores (no TMA) to `signature`'s
    output spill, or None where `implements`'s limit is the only one. Compiled on the CPU,
    every tile class in every decomposition: per-row fp8 scales (the tile's row factors held
    beside the accumulators) spilled 4-102 local-memory operations from 144 registers
    (128x144 ping-pong, 256x144-256x176 cooperative); 4-byte outputs 8-44 from 160 (128x160
    ping-pong, 256x160 cooperative split-K); other M-major outputs from 192. Beside a bias,
    `bias_register_limit`."""
    if signature.scaling == "row":
        return 144
    if signature.out_bytes == 4:
        return 160
    if signature.out_major == "m":
        return 192
    return None


def serves(config: GemmConfig, problem: GemmProblem) -> str | None:
    """Why `config` cannot compute `problem`, or None when it can."""
    why = serve_reason(config, problem, implements)
    if why:
        return why
    signature = KernelSignature.of(problem)
    why = signature_reason(config, signature)
    if why:
        return why
    plan = smem_plan(config, signature)
    if plan.ab_stages < MIN_AB_STAGES:
        return f"only {plan.ab_stages} A/B stages fit in shared memory"
    return None
