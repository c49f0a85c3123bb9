"""A tune's torch contender where cuBLASLt declines the problem (`measure.runner`): no time is
taken for it, nor a float32 stand-in timed as torch's; our finalists keep their order. On the
CPU: torch._scaled_mm and the timing are stand-ins."""

import types

import pytest
import torch

from gemmtune.core.config import CUBLAS, GemmConfig
from gemmtune.measure import runner as runner_module
from gemmtune.measure.runner import CompareJob, GemmRunner, torch_declines

DECLINED = RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLt...`")


def fp8_operands(m=8, n=64, k=128):
    a = torch.randn(m, k).to(torch.float8_e4m3fn)
    b = torch.randn(n, k).to(torch.float8_e4m3fn).t()
    return a, b, (torch.ones(m, 1), torch.ones(1, n))


def test_torch_declines_says_why_for_fp8_only(monkeypatch):
    calls = []

    def refuses(*args, **kwargs):
        calls.append(kwargs)
        raise DECLINED

    monkeypatch.setattr(torch, "_scaled_mm", refuses)
    a, b, scales = fp8_operands()
    bias = torch.zeros(64, dtype=torch.bfloat16)
    why = torch_declines(a, b, scales, torch.bfloat16, True, bias)
    assert why is not None and "CUBLAS_STATUS_NOT_SUPPORTED" in why
    assert calls == [{"out_dtype": torch.bfloat16, "use_fast_accum": True, "bias": bias}]
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    assert torch_declines(x, x.t(), (), torch.bfloat16, True, None) is None  # torch.matmul
    monkeypatch.setattr(torch, "_scaled_mm", lambda *args, **kwargs: None)
    assert torch_declines(a, b, scales, torch.bfloat16, True, bias) is None

    def wrong(*args, **kwargs):
        raise RuntimeError("mat2 must be col_major")

    monkeypatch.setattr(torch, "_scaled_mm", wrong)  # a layout: the float32 stand-in stays
    assert torch_declines(a, b.t().contiguous(), scales, torch.bfloat16, True, bias) is None


@pytest.mark.parametrize("declines", [None, "torch._scaled_mm declines the problem: ..."])
def test_compare_times_torch_only_where_it_takes_the_problem(monkeypatch, declines):
    runner = object.__new__(GemmRunner)  # the worker's state, without a GPU
    runner.torch_declines = declines
    runner.placed = [(None, None)]
    runner.flush = None
    runner.idle = types.SimpleNamespace(timed=lambda: None)
    runner._cublas = lambda a, b: None
    runner._launcher = lambda config, path: lambda a, b: None
    timed_runs = []

    def windows(runs, **options):
        timed_runs.append(len(runs))
        return [types.SimpleNamespace(median_ms=1.0 + i, spread=0.0) for i in range(len(runs))]

    monkeypatch.setattr(runner_module, "time_in_windows", windows)
    first, second = GemmConfig(tile_n=128), GemmConfig(tile_n=256)
    job = CompareJob(
        configs_json=(first.to_json(), CUBLAS, second.to_json()),
        kernel_paths=("first.so", CUBLAS, "second.so"),
    )
    got = runner.compare(job)
    assert [m.config_key for m in got] == [first.key, CUBLAS, second.key]
    if declines is None:
        assert timed_runs == [3] and [m.ms for m in got] == [1.0, 2.0, 3.0]
    else:
        assert timed_runs == [2] and [m.ms for m in got] == [1.0, None, 2.0]
        assert got[1].error == declines
