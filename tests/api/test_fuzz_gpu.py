"""tuned_gemm against a float32 reference on random calls, element by element (GPU); where
torch.matmul serves a case, against torch's own answer, to the bit.

Every case is drawn from a seed (`fuzz_cases.draw`): sizes from 1 to a few thousand, ragged
and size-1 dimensions, bf16/fp16, int8 (exact) and fp8 (unit scales), all four operand
layouts, sliced rows, storage offsets, batched 3-D, `out=` row- or column-major and poisoned,
`out_dtype`, a bias (one our kernel adds, and others added to the product). Plans are made by
a chooser that gives each problem one of a few binaries (data-parallel, stream-K with swapped
operands and a direct-store epilogue, split-K on a 2x1 cluster, a narrow swapped split-K tile
of 256-byte stages) at random runtime fields, so the cases reach every decomposition without
tuning; the binaries are compiled in parallel first.

GEMMTUNE_FUZZ_SEED replays a run (its seed is in every failure message), GEMMTUNE_FUZZ_CASES
sets how many cases are drawn, GEMMTUNE_FUZZ_SECONDS bounds the run.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter

import pytest
import torch
from fuzz_cases import draw, make_bias, make_tensors, mismatches

from gemmtune import workers
from gemmtune.api.bias import BiasFacts, fuses
from gemmtune.api.choice import ConfigChooser
from gemmtune.api.dispatch import Dispatcher
from gemmtune.cache.kernels import KernelCache
from gemmtune.core.config import Decomposition, GemmConfig, Schedule
from gemmtune.core.problem import GemmProblem, fallback_matmul
from gemmtune.kernels import tile_k
from gemmtune.kernels.schedule_model import ceil_div
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules
from gemmtune.measure.runner import reference_product
from gemmtune.space.candidates import runtime_variants
from gemmtune.workers.compiler import CompileJob, compile_all

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

MIN_CASES = 1000
#: At least 1/n of each input type's cases must reach our kernels (the rest exercise the
#: fallback): 16-bit types are served in every layout, 8-bit ones too (on K-major copies of
#: operands in the layout 8-bit MMAs cannot read), all where rows read as given are a multiple
#: of 16 bytes.
SERVED_SHARE = {
    torch.bfloat16: 5,
    torch.float16: 5,
    torch.int8: 8,
    torch.float8_e4m3fn: 8,
    torch.float8_e5m2: 8,
}

FUZZ_BINARIES = (
    GemmConfig(tile_m=128, tile_n=128),
    GemmConfig(
        tile_m=128,
        tile_n=64,
        schedule=Schedule.PINGPONG,
        tma_store=False,
        decomposition=Decomposition.STREAM_K,
        swap_ab=True,
    ),
    GemmConfig(tile_m=128, tile_n=128, cluster_m=2, decomposition=Decomposition.SPLIT_K, splits=2),
    GemmConfig(
        tile_m=64,
        tile_n=32,
        schedule=Schedule.PINGPONG,
        stage_k_bytes=256,
        decomposition=Decomposition.SPLIT_K,
        splits=2,
        swap_ab=True,
    ),
)


class FuzzChooser(ConfigChooser):
    """One of `FUZZ_BINARIES` that serves the problem, at runtime fields drawn from the
    problem's sizes; None (torch.matmul) where none serves."""

    def config_for(self, problem: GemmProblem, mode: str) -> GemmConfig | None:
        serving = [
            variants
            for c in FUZZ_BINARIES
            if rules.serves(c, problem) is None
            for variants in [
                runtime_variants(c, ceil_div(problem.k, tile_k(c, problem.a_dtype.itemsize)))
            ]
            if variants  # split-K needs two k-tiles
        ]
        if not serving:
            return None
        rng = random.Random(hash((problem.m, problem.n, problem.k, problem.l)))
        return rng.choice(rng.choice(serving))


def _call_arguments(case, out) -> dict:
    return {"out": out} if out is not None else {"out_dtype": case.out_dtype}


def _precompile(cases, chooser: FuzzChooser, cache: KernelCache) -> int:
    jobs = set()
    for case in cases:
        a, b, out = make_tensors(case, "cuda", data=False)
        out_dtype = None if out is not None else case.out_dtype
        problem = GemmProblem.from_tensors(a, b, out, out_dtype)
        problems = [problem] if problem.supported else []
        bias = make_bias(case, "cuda")
        if problems and bias is not None and fuses(BiasFacts.of(bias), problem):
            problems.append(GemmProblem.from_tensors(a, b, out, out_dtype, bias=True))
        for p in problems:
            config = chooser.config_for(p, "heuristic") if p.supported else None
            if config is not None:
                jobs.add(CompileJob(config, KernelSignature.of(p)))
    outcomes = compile_all(
        sorted(jobs, key=lambda j: j.name), cache.folder, workers.compile_pool("sm_90a")
    )
    failed = [o for o in outcomes if o.error]
    assert not failed, f"{len(failed)} fuzz binaries failed to compile: {failed[0].error}"
    return len(jobs)


def test_fuzz_tuned_gemm_element_by_element(tmp_path):
    seed = int(os.environ.get("GEMMTUNE_FUZZ_SEED", time.time_ns() % 1_000_000))
    count = int(os.environ.get("GEMMTUNE_FUZZ_CASES", 1200))
    budget_s = float(os.environ.get("GEMMTUNE_FUZZ_SECONDS", 300))
    cases = [draw(seed * 100_000 + i) for i in range(count)]
    chooser = FuzzChooser()
    dispatcher = Dispatcher(chooser)
    cache = dispatcher.kernel_caches["sm_90a"] = KernelCache("sm_90a", tmp_path / "kernels")
    binaries = _precompile(cases, chooser, cache)

    failures: list[str] = []
    drawn: Counter[torch.dtype] = Counter()
    served: Counter[torch.dtype] = Counter()
    start = time.monotonic()
    for case in cases:
        if time.monotonic() - start > budget_s:
            break
        a, b, out = make_tensors(case, "cuda")
        bias = make_bias(case, "cuda")
        kwargs = _call_arguments(case, out)
        biased = kwargs if bias is None else {**kwargs, "bias": bias}
        try:
            got = dispatcher(a, b, **biased)
            plan = dispatcher.plan(a, b, **biased)
            # a bias our kernel does not add is added to tuned_gemm's product, ours or torch's
            ours = plan.config is not None or (
                bias is not None
                and plan.torch_op is None
                and dispatcher.plan(a, b, **kwargs).config is not None
            )
        except Exception as exc:  # every failure is reported with its case
            failures.append(f"case {case.seed}: {case.describe()}: raised {exc!r}")
            continue
        drawn[case.dtype] += 1
        served[case.dtype] += ours
        reference = reference_product(a, b)
        if bias is not None:  # int32 stays exact
            reference = reference + (bias if not reference.is_floating_point() else bias.float())
        if got.shape != reference.shape or got.dtype != case.result_dtype:
            failures.append(f"case {case.seed}: {case.describe()}: {got.shape} {got.dtype}")
        elif out is not None and got.data_ptr() != out.data_ptr():
            failures.append(f"case {case.seed}: {case.describe()}: result is not `out`")
        elif not ours:
            # torch served: the answer must be torch's own, to the bit (cuBLAS may sum in the
            # output type, which a tolerance meant for our kernels does not allow for)
            expected = fallback_matmul(a, b, None, case.result_dtype)
            if bias is not None:
                torch_op = plan.torch_op  # torch.addmm's route, or the bias added to torch's
                expected = torch_op(a, b, bias) if torch_op else expected.add_(bias)
            if not torch.equal(got, expected):
                bad = int((got != expected).sum())
                failures.append(f"case {case.seed}: {case.describe()}: {bad} unlike torch's")
        else:
            fp8 = case.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
            magnitude = torch.matmul(a.float().abs(), b.float().abs()) if fp8 else None
            bad = mismatches(got, reference, case.k, fp8=fp8, magnitude=magnitude)
            if bad:
                config = plan.config.key if plan.config is not None else "bias added after"
                failures.append(f"case {case.seed}: {case.describe()}: {bad} wrong ({config})")
    torch.cuda.synchronize()
    done = sum(drawn.values())
    per_type = ", ".join(f"{served[t]}/{drawn[t]} {t}" for t in drawn)
    summary = (
        f"seed {seed} (GEMMTUNE_FUZZ_SEED): {done} cases, on our kernels {per_type} "
        f"({binaries} binaries), {len(failures)} failed"
    )
    print(summary)
    assert not failures, summary + "\n" + "\n".join(failures[:20])
    assert done >= MIN_CASES, summary + f": fewer than {MIN_CASES} in {budget_s:.0f} s"
    starved = [str(t) for t in drawn if served[t] < drawn[t] // SERVED_SHARE[t]]
    assert not starved, summary + f": too few {starved} cases reached our kernels"
