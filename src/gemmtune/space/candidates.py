"""Every valid `GemmConfig` for a problem.

The kernels say what is valid (`kernels/<arch>/rules.py`: tiles, clusters, shared memory,
dtypes, layouts, alignment); this module only multiplies their binaries out by operand swap
(each binary also computes the transposed product, out^T = b^T @ a^T, where M and N trade
places) and by the runtime fields: split counts, raster orders, swizzles. Order is
deterministic: the kernel's order of binaries, unswapped before swapped, then splits, raster,
swizzle.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from types import ModuleType

from gemmtune.core.config import SWIZZLES, Decomposition, GemmConfig, Raster
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules as sm90_rules
from gemmtune.kernels.sm100 import rules as sm100_rules

log = logging.getLogger(__name__)

SPLIT_COUNTS = (2, 3, 4, 6, 8, 12, 16)
RULES: dict[Arch, ModuleType] = {Arch.SM90: sm90_rules, Arch.SM100: sm100_rules}


def rules_for(arch: Arch) -> ModuleType:
    if arch not in RULES:
        raise ValueError(f"gemmtune has no kernels for {arch.value}")
    return RULES[arch]


def binaries(problem: GemmProblem, arch: Arch | None = None) -> list[GemmConfig]:
    """The compiled variants (runtime fields at their defaults) that can serve `problem`."""
    return list(_served(problem, arch))


def _served(problem: GemmProblem, arch: Arch | None) -> tuple[GemmConfig, ...]:
    """`binaries`, kept per architecture and kernel signature: what the kernels' `serves`
    reads of a supported problem (its dtypes, majors and output alignment are the signature's;
    its sizes it does not read), so the buckets of one model's layers, which share a
    signature, enumerate the space once (95,000 checks, a fifth of a second)."""
    arch = arch or problem.arch
    rules = rules_for(arch)
    if not problem.supported:
        return ()
    if arch is not problem.arch:
        # describe the same problem on the other architecture (enumeration on the CPU)
        problem = _on_arch(problem, arch)
    key = (arch, KernelSignature.of(problem))
    found = _SERVED.get(key)
    if found is None:
        found = tuple(v for v in _implemented(arch) if rules.serves(v, problem) is None)
        _SERVED[key] = found
    return found


#: `_served`'s answers: a few signatures per process (a model's dtypes and layouts)
_SERVED: dict[tuple[Arch, KernelSignature], tuple[GemmConfig, ...]] = {}


def refusal(config: GemmConfig, problem: GemmProblem) -> str | None:
    """Why `config` cannot serve `problem` on the problem's architecture, or None: what keeps
    a config named by hand (`tune(configs=...)`) from running where its binary would write
    the wrong memory, such as a TMA store to an output TMA cannot address."""
    return rules_for(problem.arch).serves(config, problem)


@functools.cache
def _implemented(arch: Arch) -> tuple[GemmConfig, ...]:
    """Every binary `arch`'s kernels implement, each unswapped then swapped: the same for every
    problem, so a process enumerates them once."""
    return tuple(
        variant
        for config in rules_for(arch).implemented_configs(tuple(Decomposition))
        for variant in (config, dataclasses.replace(config, swap_ab=True))
    )


def _on_arch(problem: GemmProblem, arch: Arch) -> GemmProblem:
    return dataclasses.replace(problem, arch=arch)


def runtime_variants(
    binary: GemmConfig, k_tiles: int | None = None, *, orders: bool = True
) -> list[GemmConfig]:
    """`binary` at every split count (split-K; at most one split per k-tile) and, with
    `orders`, every raster order and swizzle (else at the default ones)."""
    splits = (1,)
    if binary.decomposition is Decomposition.SPLIT_K:
        splits = tuple(s for s in SPLIT_COUNTS if k_tiles is None or s <= k_tiles)
    rasters, swizzles = (tuple(Raster), SWIZZLES) if orders else ((Raster.ALONG_M,), (1,))
    return [
        binary.with_runtime(splits=s, raster=raster, swizzle=swizzle)
        for s in splits
        for raster in rasters
        for swizzle in swizzles
    ]


@functools.lru_cache(maxsize=1 << 16)
def _variants(binary: GemmConfig, k_tiles: int, orders: bool) -> tuple[GemmConfig, ...]:
    """`runtime_variants`, kept: a binary's split counts depend only on its k-tiles."""
    return tuple(runtime_variants(binary, k_tiles, orders=orders))


def candidates(
    problem: GemmProblem, arch: Arch | None = None, *, orders: bool = True
) -> list[GemmConfig]:
    """Every valid config for `problem` on `arch` (by default the problem's GPU); without
    `orders`, only at the default raster order and swizzle (what the ranking model ranks)."""
    from gemmtune.kernels import tile_k
    from gemmtune.kernels.schedule_model import ceil_div

    ab_bytes = problem.a_dtype.itemsize
    out = [
        variant
        for binary in _served(problem, arch)
        for variant in _variants(binary, ceil_div(problem.k, tile_k(binary, ab_bytes)), orders)
    ]
    log.info(
        "%d candidate configs for %dx%dx%dx%d on %s",
        len(out),
        problem.m,
        problem.n,
        problem.k,
        problem.l,
        (arch or problem.arch).value,
    )
    return out
