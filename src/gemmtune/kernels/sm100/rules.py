"""What the Blackwell kernel implements and serves (tcgen05 MMA, TMEM accumulators, 2-CTA).

Plain Python, like `kernels/sm90/rules.py`: the search space reads it, and the kernel
(`sm100/kernel.py`) follows its models (the CTA pair's split of a tile, the tensor-memory and
shared-memory plans) and checks them against the DSL's layouts when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gemmtune.core.config import STAGE_K_BYTES, Decomposition, GemmConfig, expand_families
from gemmtune.kernels import serve_reason
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90.rules import (
    MIN_AB_STAGES,
    SMEM_CAPACITY,
    SMEM_RESERVED,
    SmemPlan,
)

if TYPE_CHECKING:
    from gemmtune.core.problem import GemmProblem

#: The warps of a CTA: four epilogue warps, one issuing MMAs, one issuing TMA loads
EPILOGUE_WARPS = (0, 1, 2, 3)
MMA_WARP = 4
TMA_WARP = 5
THREADS = 32 * 6
#: named barrier ids (0 is __syncthreads)
EPILOGUE_BARRIER = 1
TMEM_ALLOC_BARRIER = 2
TMEM_DEALLOC_BARRIER = 3

#: K extent of a tile in elements, of every input type
TILE_K = 64
#: The one stage width (`GemmConfig.stage_k_bytes`) the kernel implements
DEFAULT_STAGE_K_BYTES = STAGE_K_BYTES[0]


def tile_k(ab_bytes: int, stage_k_bytes: int = DEFAULT_STAGE_K_BYTES) -> int:
    """K extent of a tile in elements of `ab_bytes` bytes: `TILE_K` whatever the type (the
    kernel implements the default stage width only)."""
    return TILE_K


#: MMA tile M per CTA pair: 64 or 128 with one CTA, 128 or 256 across two (2-CTA instructions)
TILE_M_ONE_CTA = (64, 128)
TILE_M_TWO_CTA = (128, 256)
TILE_N_CHOICES = tuple(range(32, 257, 32))
MAX_CLUSTER_CTAS = 16
#: Tensor memory: 128 lanes x 512 columns of 32 bits per SM, allocated in powers of two of at
#: least 32 columns (`tcgen05.alloc`).
TMEM_COLUMNS = 512
TMEM_LANES = 128
TMEM_MIN_ALLOCATION = 32
#: Accumulator buffers in tensor memory: the MMA fills one tile's while the epilogue drains
#: the last one's.
ACCUMULATOR_BUFFERS = 2
#: Columns of an epilogue sub-tile (TMEM -> registers -> shared memory -> TMA store).
EPI_TILE_N = 32
EPI_STAGES = 2


@dataclass(frozen=True)
class CtaShare:
    """What one CTA of an MMA's CTA group loads and stores. With 2-CTA instructions
    (`cta_group::2`) the pair splits A's rows, B's rows (the tile's N) and the output's rows
    between them; the MMA, issued by the pair's even CTA, reads B from both CTAs' shared
    memory, and each CTA's tensor memory holds the accumulators of its own output rows."""

    a_rows: int
    b_rows: int
    out_rows: int
    out_cols: int

    def a_row_offset(self, peer: int) -> int:
        """Where the `peer`-th CTA of the group (0 or 1) starts in the tile's A rows."""
        return peer * self.a_rows

    def b_row_offset(self, peer: int) -> int:
        """Where it starts in the tile's B rows (N)."""
        return peer * self.b_rows


def cta_share(config: GemmConfig) -> CtaShare:
    group = 2 if config.two_cta else 1
    return CtaShare(
        a_rows=config.tile_m // group,
        b_rows=config.tile_n // group,
        out_rows=config.tile_m // group,
        out_cols=config.tile_n,
    )


def tile_m_per_cta(config: GemmConfig) -> int:
    return cta_share(config).out_rows


@dataclass(frozen=True)
class TmemPlan:
    """The tensor memory one CTA allocates: `buffers` fp32 accumulator tiles side by side, each
    `buffer_columns` wide."""

    buffer_columns: int
    buffers: int

    @property
    def used_columns(self) -> int:
        return self.buffer_columns * self.buffers

    @property
    def allocated_columns(self) -> int:
        """What `tcgen05.alloc` is asked for: a power of two of at least 32 columns."""
        columns = max(TMEM_MIN_ALLOCATION, self.used_columns)
        return 1 << (columns - 1).bit_length()

    def buffer_start(self, buffer: int) -> int:
        """The first column of accumulator buffer `buffer` (the tile's i-th uses i % buffers)."""
        return (buffer % self.buffers) * self.buffer_columns


def tmem_plan(config: GemmConfig) -> TmemPlan:
    """A CTA's fp32 accumulators fill its 128 lanes row by row: 128 rows x n take n columns,
    64 rows x n take n / 2 (the DSL's layouts agree: `BlackwellGemm` checks at build time)."""
    share = cta_share(config)
    columns = share.out_cols * share.out_rows // TMEM_LANES
    return TmemPlan(buffer_columns=columns, buffers=ACCUMULATOR_BUFFERS)


def smem_plan(config: GemmConfig, signature: KernelSignature) -> SmemPlan:
    """One CTA's shared memory: the epilogue's buffers (TMA store only), then as many A/B
    stages of its share of the tile as fit in the rest."""
    share = cta_share(config)
    ab_stage_bytes = (share.a_rows + share.b_rows) * TILE_K * signature.ab_bytes
    epi_stage_bytes = share.out_rows * EPI_TILE_N * signature.out_bytes if config.tma_store else 0
    epi_stages = EPI_STAGES if config.tma_store else 0
    stages = (SMEM_CAPACITY - SMEM_RESERVED - epi_stages * epi_stage_bytes) // ab_stage_bytes
    return SmemPlan(stages, epi_stages, ab_stage_bytes, epi_stage_bytes)


def implements(config: GemmConfig) -> str | None:
    """Why the Blackwell kernel cannot be built for `config`, or None when it can."""
    if config.arch != "sm_100":
        return f"the Blackwell kernel compiles for sm_100, not {config.arch}"
    if config.stage_k_bytes != DEFAULT_STAGE_K_BYTES:
        return f"the Blackwell kernel's stages hold {DEFAULT_STAGE_K_BYTES} bytes of each row in K"
    allowed = TILE_M_TWO_CTA if config.two_cta else TILE_M_ONE_CTA
    if config.tile_m not in allowed:
        return f"tile_m must be one of {allowed} {'with' if config.two_cta else 'without'} 2-CTA"
    if config.tile_n not in TILE_N_CHOICES:
        return f"tile_n must be one of {TILE_N_CHOICES}"
    ctas = config.cluster_m * config.cluster_n
    if ctas > MAX_CLUSTER_CTAS:
        return f"a cluster has at most {MAX_CLUSTER_CTAS} CTAs"
    if config.two_cta and config.cluster_m % 2:
        return "2-CTA instructions need an even cluster_m"
    if tmem_plan(config).allocated_columns > TMEM_COLUMNS:
        return f"{ACCUMULATOR_BUFFERS} accumulator buffers must fit in {TMEM_COLUMNS} TMEM columns"
    if smem_plan(config, KernelSignature(out_dtype="fp32")).ab_stages < MIN_AB_STAGES:
        return "fewer than two A/B stages fit in shared memory"
    return None


CLUSTER_SHAPES = tuple(
    (m, n) for m in (1, 2, 4, 8, 16) for n in (1, 2, 4, 8, 16) if m * n <= MAX_CLUSTER_CTAS
)


def implemented_configs(
    decompositions: tuple[Decomposition, ...] = (Decomposition.DATA_PARALLEL,),
) -> list[GemmConfig]:
    """Every config of the planned Blackwell kernel, runtime fields at their defaults."""
    families = [
        {
            "arch": "sm_100",
            "tile_m": tile_m,
            "tile_n": tile_n,
            "cluster_m": cluster_m,
            "cluster_n": cluster_n,
            "two_cta": two_cta,
            "tma_store": tma_store,
        }
        for two_cta in (False, True)
        for tile_m in (TILE_M_TWO_CTA if two_cta else TILE_M_ONE_CTA)
        for tile_n in TILE_N_CHOICES
        for cluster_m, cluster_n in CLUSTER_SHAPES
        if not (two_cta and cluster_m % 2)
        for tma_store in (True, False)
    ]
    return [c for c in expand_families(families, decompositions) if implements(c) is None]


def serves(config: GemmConfig, problem: GemmProblem) -> str | None:
    """Why `config` cannot compute `problem`, or None when it can."""
    return serve_reason(config, problem, implements)
