"""Our GEMM kernels (CuTe DSL) and what each can serve."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from gemmtune.core import dtypes
from gemmtune.core.config import GemmConfig

if TYPE_CHECKING:
    from gemmtune.core.problem import GemmProblem


#: The rules module of each architecture's kernel
RULES = {"sm_90": "gemmtune.kernels.sm90.rules", "sm_100": "gemmtune.kernels.sm100.rules"}


@functools.cache
def _rules(arch: str):
    import importlib

    return importlib.import_module(RULES[arch])


def tile_k(config: GemmConfig, ab_bytes: int) -> int:
    """K extent, in elements of `ab_bytes` bytes, of one pipeline stage of `config`'s kernel:
    what the host counts k-tiles in, as the kernel does."""
    return _rules(config.arch).tile_k(ab_bytes, config.stage_k_bytes)


def serve_reason(
    config: GemmConfig, problem: GemmProblem, implements: Callable[[GemmConfig], str | None]
) -> str | None:
    """What every kernel requires of a problem: why `config` (whose kernel answers
    `implements`) cannot compute `problem`, or None."""
    if not problem.supported:
        return str(problem.fallback_reason)
    why = implements(config)
    if why:
        return why
    if problem.arch.value != config.arch:
        return f"the problem is on {problem.arch.value}, the config is for {config.arch}"
    if not dtypes.inputs_pair(dtypes.name_of(problem.a_dtype), dtypes.name_of(problem.b_dtype)):
        return f"A and B must share one of {', '.join(dtypes.KERNEL_INPUTS)}, or be two fp8 types"
    if config.tma_store and not problem.out_aligned:
        return "the output's base or strides are not 16-byte aligned: TMA cannot store it"
    return None
