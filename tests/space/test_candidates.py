import os
import subprocess
import sys

import pytest
import torch

from gemmtune.core.config import Decomposition, GemmConfig, Raster
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand
from gemmtune.kernels.sm90 import rules as sm90
from gemmtune.kernels.sm100 import rules as sm100
from gemmtune.space import binaries, candidates, runtime_variants


def problem(m, n, k, dtype=torch.bfloat16, arch=Arch.SM90, b_cols_major=False):
    def operand(rows, cols, column_major=False):
        stride = (1, rows) if column_major else (cols, 1)
        return Operand((rows, cols), stride, dtype, torch.device("cuda", 0), 1 << 20)

    return GemmProblem.from_operands(operand(m, k), operand(k, n, b_cols_major), arch=arch)


def test_sm90_space_counts_and_validity():
    p = problem(4096, 4096, 4096)
    configs = candidates(p)
    # 2982 binaries: 1086 data-parallel, 888 stream-K, 1008 split-K (7 split counts; not the
    # 72 whose reduction spills, nor the thread-store tiles that spill), 108 of each the narrow
    # tiles with 256-byte stages, each also swapped but for the 12 cooperative data-parallel
    # ones with 192+ accumulators and thread stores (spill on the swapped, M-major output),
    # x 8 runtime
    assert len(binaries(p)) == 2982 * 2 - 12
    assert len(configs) == ((1086 + 888 + 1008 * 7) * 2 - 12) * 8
    assert len({c.key for c in configs}) == len(configs)
    assert all(sm90.serves(c, p) is None for c in configs)
    assert {c.decomposition for c in configs} == set(Decomposition)
    assert {(c.raster, c.swizzle) for c in configs} == {
        (r, s) for r in Raster for s in (1, 2, 4, 8)
    }


_KEYS_OF_A_PROBLEM = """
import hashlib, torch
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem
from gemmtune.space import candidates
p = GemmProblem.of_shape(1000, 2000, 3000, dtype=torch.bfloat16, device="cuda", arch=Arch.SM90)
keys = [c.key for c in candidates(p)]
print(len(keys), hashlib.sha256("\\n".join(keys).encode()).hexdigest())
"""


def test_enumeration_is_the_same_in_every_process():
    """The order of the space (the ranking's ties, the first pass's order) does not depend on
    the process's string hashing."""
    runs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _KEYS_OF_A_PROBLEM],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        runs.add(done.stdout.split("\n")[-2])
    assert len(runs) == 1 and int(next(iter(runs)).split()[0]) > 10000


def test_split_counts_never_exceed_k_tiles():
    p = problem(512, 512, 192)  # three k-tiles
    splits = {c.splits for c in candidates(p) if c.decomposition is Decomposition.SPLIT_K}
    assert splits == {2, 3}


def test_unserved_problems_have_no_candidates():
    assert candidates(problem(64, 64, 64, dtype=torch.float32)) == []
    # misaligned K-major A (k = 20 bf16 per row is 40 bytes); a row-major B of such rows is
    # copied K-major (`GemmProblem.copied`) and served
    assert candidates(problem(64, 64, 20)) == []
    assert candidates(problem(64, 20, 64), orders=False)


@pytest.mark.parametrize("arch", [Arch.SM90, Arch.SM100])
def test_an_output_tma_cannot_store_gets_direct_stores_only(arch):
    # rows of 2,100 bf16 values are 4,200 bytes: a linear layer's weight (K-major b) serves,
    # the output is written by direct stores
    p = problem(2050, 2100, 2000, arch=arch, b_cols_major=True)
    assert p.supported and not p.out_aligned
    served = candidates(p, orders=False)
    assert served and not any(c.tma_store for c in served)
    aligned = candidates(problem(2048, 2048, 2048, arch=arch, b_cols_major=True), orders=False)
    assert {c for c in aligned if not c.tma_store} >= set(served)


def test_sm100_space_is_enumerable_on_the_cpu():
    configs = sm100.implemented_configs(tuple(Decomposition))
    assert len(configs) == 3 * 800  # each binary data-parallel, split-K and stream-K
    assert {c.decomposition for c in configs} == set(Decomposition)
    assert {c.tile_m for c in configs if not c.two_cta} == {64, 128}
    assert {c.tile_m for c in configs if c.two_cta} == {128, 256}
    assert {c.tile_n for c in configs} == set(range(32, 257, 32))
    assert all(c.cluster_m % 2 == 0 for c in configs if c.two_cta)
    assert max(c.cluster_m * c.cluster_n for c in configs) == 16
    assert {c.tma_store for c in configs} == {True, False}
    on_sm90 = candidates(problem(4096, 4096, 4096), Arch.SM100)
    assert on_sm90 and all(c.arch == "sm_100" for c in on_sm90)
    assert candidates(problem(4096, 4096, 4096, arch=Arch.SM100))


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (GemmConfig(arch="sm_100", tile_m=64, tile_n=32), None),
        (GemmConfig(arch="sm_100", tile_m=256, tile_n=256, cluster_m=2, two_cta=True), None),
        (GemmConfig(arch="sm_100", tile_m=128, tile_n=48), "tile_n"),
        (GemmConfig(tile_m=128, tile_n=128), "sm_100"),
    ],
)
def test_sm100_rules(config, why):
    result = sm100.implements(config)
    assert (result is None) if why is None else (why in result)


def test_runtime_variants_cost_no_compile():
    binary = GemmConfig(decomposition="split_k", splits=2)
    variants = runtime_variants(binary, k_tiles=100)
    assert len(variants) == 7 * 2 * 4
    assert {v.compile_key for v in variants} == {binary.compile_key}


def test_binaries_kept_per_signature_are_what_every_problem_of_it_would_enumerate():
    from gemmtune.space.candidates import _implemented

    problems = [
        problem(1, 4096, 4096),
        problem(4096, 4096, 4096),  # the same signature, other sizes
        problem(333, 2100, 3000),  # rows of 2100 bf16 TMA cannot store
        problem(64, 512, 1024, dtype=torch.float16, b_cols_major=True),
        problem(256, 1024, 4096, arch=Arch.SM100),
    ]
    for p in problems:
        rules = sm100 if p.arch is Arch.SM100 else sm90
        assert binaries(p) == [v for v in _implemented(p.arch) if rules.serves(v, p) is None]
    assert binaries(problems[0]) == binaries(problems[1])
    assert binaries(problems[2]) != binaries(problems[0])
    # the split counts follow each problem's k-tiles
    short, long = problem(128, 128, 128), problem(128, 128, 4096)
    splits = {c.splits for c in candidates(short, orders=False)}
    assert max(splits) < max(c.splits for c in candidates(long, orders=False))
