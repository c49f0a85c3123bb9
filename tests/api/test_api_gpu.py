"""The user API on the GPU: tuned_gemm against torch.matmul on random problems, tuning through
tuned_gemm, the custom op under torch.compile, and the examples."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gemmtune.api.dispatch import Dispatcher
from gemmtune.cache.kernels import KernelCache
from gemmtune.cache.results import ResultsCache
from gemmtune.core.config import GemmConfig
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.verify import check
from gemmtune.workers.compiler import CompileJob, CompilePool, compile_all

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# three kernels, one per decomposition, stand in for the ranking model's choice so that 200
# random problems need 96 compiles (done in parallel up front) instead of hundreds
KERNELS = [
    GemmConfig(tile_m=128, tile_n=128),
    GemmConfig(tile_m=128, tile_n=192, schedule="pingpong", cluster_m=2, decomposition="stream_k"),
    GemmConfig(tile_m=128, tile_n=128, tma_store=False, decomposition="split_k", splits=3),
]


class FewKernels(Dispatcher):
    @staticmethod
    def _first_choice(problem):
        return KERNELS[(problem.m * 7 + problem.n * 3 + problem.k) % len(KERNELS)]


@pytest.fixture(scope="module")
def dispatcher(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    d = FewKernels(results=ResultsCache(folder / "results.sqlite"))
    d.kernel_caches["sm_90a"] = kernels = KernelCache("sm_90a", folder / "kernels")
    signatures = [
        KernelSignature(dtype, out, a_major, b_major, "n", batched)
        for dtype in ("bf16", "fp16")
        for out in (dtype, "fp32")
        for a_major in ("k", "m")
        for b_major in ("n", "k")
        for batched in (False, True)
    ]
    jobs = [CompileJob(config, s) for config in KERNELS for s in signatures]
    pool = CompilePool("sm_90a", max_workers=max(1, (os.cpu_count() or 2) - 1))
    failed = [o.job.name for o in compile_all(jobs, kernels.folder, pool) if o.path is None]
    pool.stop_workers()
    assert not failed
    return d


def operand(rows, cols, batch, dtype, k_major_rows: bool, generator):
    """A random (batch?, rows, cols) tensor whose contiguous dimension is cols when
    `k_major_rows`, else rows (a transposed view)."""
    lead = (batch,) if batch else ()
    shape = (*lead, rows, cols) if k_major_rows else (*lead, cols, rows)
    t = torch.randn(shape, device="cuda", dtype=dtype, generator=generator)
    return t if k_major_rows else t.transpose(-1, -2)


def test_tuned_gemm_matches_torch_matmul_on_200_random_problems(dispatcher):
    seed = random.randrange(1 << 30)
    rng, generator = random.Random(seed), torch.Generator("cuda").manual_seed(seed)
    for case in range(200):
        dtype = rng.choice([torch.bfloat16, torch.float16, torch.float16, torch.float32])
        m, n, k = (rng.choice([8, 16, 64]) * rng.randint(1, 48) for _ in range(3))
        if rng.random() < 0.15:
            k += rng.choice([1, 3])  # misaligned rows: torch.matmul serves it
        batch = rng.choice([0, 0, 1, 3])
        a = operand(m, k, batch, dtype, rng.random() < 0.5, generator)
        b = operand(k, n, batch, dtype, rng.random() < 0.5, generator)
        out_dtype = rng.choice([None, None, torch.float32])
        out = None
        if rng.random() < 0.3:
            lead = (batch,) if batch else ()
            out = torch.full((*lead, m, n), float("nan"), device="cuda", dtype=out_dtype or dtype)
            out_dtype = None
        result = dispatcher(a, b, out=out, out_dtype=out_dtype, mode="heuristic")
        reference = torch.matmul(a.float(), b.float())
        what = (
            f"case {case} (seed {seed}): {tuple(a.shape)}@{tuple(b.shape)} {dtype} out={out_dtype}"
        )
        assert result.shape == reference.shape, what
        assert out is None or result is out, what
        ok, err = check(result, reference)
        assert ok, f"{what}: relative error {err:.3g}"
    served = [p for p in dispatcher.plans.values() if p is not None and p.function is not None]
    assert len(served) >= 100, f"only {len(served)} of 200 problems reached our kernels"


def test_tuned_gemm_tunes_with_cublas_as_a_candidate_then_hits(tmp_path):
    d = Dispatcher(results=ResultsCache(tmp_path / "results.sqlite"))
    d.kernel_caches["sm_90a"] = KernelCache("sm_90a", tmp_path / "kernels")
    a = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16)
    out = d(a, b)
    assert check(out, a.float() @ b.float())[0]
    ((_, record),) = d.results_cache().items()
    assert "torch.matmul" in record.how and len(record.runners_up) >= 8
    a2 = torch.randn(1800, 1000, device="cuda", dtype=torch.bfloat16)  # same bucket
    b2 = torch.randn(1000, 3000, device="cuda", dtype=torch.bfloat16)
    assert check(d(a2, b2), a2.float() @ b2.float())[0]
    assert len(d.results_cache().items()) == 1  # no second tuning


def test_custom_op_under_torch_compile(monkeypatch):
    import gemmtune
    from gemmtune.api.dispatch import DISPATCHER

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")  # the model's choice: no tuning here
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    ).to("cuda", torch.bfloat16)
    x = torch.randn(4, 64, 512, device="cuda", dtype=torch.bfloat16)
    expected = model(x).float()
    assert gemmtune.use_tuned_linear(model) == 2
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(x)
    assert got.shape == expected.shape
    assert check(got, expected)[0]
    assert any(p is not None and p.function is not None for p in DISPATCHER.plans.values())


@pytest.mark.parametrize(
    "script, args",
    [
        ("quickstart.py", []),
        ("pretune_model_shapes.py", ["--tokens", "128", "--layers", "qkv", "o"]),
        ("custom_kernel_decorator.py", []),
    ],
)
def test_examples_run(tmp_path, script, args):
    env = dict(os.environ, GEMMTUNE_CACHE_DIR=str(tmp_path))
    env.pop("CUTE_DSL_ARCH", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "found no working kernel" not in done.stderr
    assert ResultsCache(tmp_path / "results.sqlite").items()  # the tuning was stored
    if script == "pretune_model_shapes.py":
        assert (tmp_path / "pretuned-gemms.json").exists()
    if script == "custom_kernel_decorator.py":
        assert "tunings: 1" in done.stdout and "matches torch" in done.stdout


@pytest.mark.timeout(600)
def test_processes_on_one_new_bucket_share_one_tune(tmp_path):
    child = Path(__file__).with_name("concurrent_tune_child.py")
    env = {**os.environ, "GEMMTUNE_CACHE_DIR": str(tmp_path)}
    processes = [
        subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    lines = [p.communicate(timeout=500)[0] for p in processes]
    results = [
        next(x.split()[1:] for x in out.splitlines() if x.startswith("RESULT")) for out in lines
    ]
    assert len({config for config, _, _ in results}) == 1  # one winner for all
    assert [tuned for _, tuned, _ in results].count("True") == 1  # tuned by one process
    assert all(correct == "True" for _, _, correct in results)
