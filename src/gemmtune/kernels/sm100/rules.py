"""What the Blackwell kernel will implement and serve (tcgen05 MMA, TMEM accumulators, 2-CTA).

Plain Python, like `kernels/sm90/rules.py`: the search space reads it; there is no kernel yet,
so `implements` states the hardware's and the planned kernel's limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gemmtune.core.config import Decomposition, GemmConfig, expand_families
from gemmtune.kernels import serve_reason
from gemmtune.kernels.sm90.rules import MIN_AB_STAGES, SMEM_CAPACITY, SMEM_RESERVED, TILE_K

if TYPE_CHECKING:
    from gemmtune.core.problem import GemmProblem

#: MMA tile M per CTA pair: 64 or 128 with one CTA, 128 or 256 across two (2-CTA instructions)
TILE_M_ONE_CTA = (64, 128)
TILE_M_TWO_CTA = (128, 256)
TILE_N_CHOICES = tuple(range(32, 257, 32))
MAX_CLUSTER_CTAS = 16
#: tensor memory: 512 columns of 32-bit per SM; accumulators are double-buffered
TMEM_COLUMNS = 512
AB_BYTES = 2


def tile_m_per_cta(config: GemmConfig) -> int:
    return config.tile_m // 2 if config.two_cta else config.tile_m


def implements(config: GemmConfig) -> str | None:
    """Why the Blackwell kernel cannot be built for `config`, or None when it can."""
    if config.arch != "sm_100":
        return f"the Blackwell kernel compiles for sm_100, not {config.arch}"
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
    if 2 * config.tile_n > TMEM_COLUMNS:
        return "two accumulator buffers of tile_n columns must fit in tensor memory"
    stage = (tile_m_per_cta(config) + config.tile_n) * TILE_K * AB_BYTES
    epilogue = tile_m_per_cta(config) * 32 * 4 * 2 if config.tma_store else 0
    if (SMEM_CAPACITY - SMEM_RESERVED - epilogue) // stage < MIN_AB_STAGES:
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
