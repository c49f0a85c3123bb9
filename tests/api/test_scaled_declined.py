"""A torch._scaled_mm call that torch checks and cuBLASLt declines (no algorithm: per-row
scales and a bias at some sizes, on an H200 the 8B down projection at 1-16 rows) is served by
our kernel; torch's other errors stay the call's. On the CPU: torch._scaled_mm and the plan
are stand-ins."""

import pytest
import torch

from gemmtune.api.dispatch import Dispatcher, Plan
from gemmtune.core.config import GemmConfig
from gemmtune.core.problem import declined_by_cublas

DECLINED = RuntimeError(
    "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmulAlgoGetHeuristic( "
    "ltHandle, computeDesc.descriptor(), ...)`"
)
WRONG = RuntimeError("Expected b to be column-major")


def test_a_declined_call_is_told_from_a_wrong_one():
    assert declined_by_cublas(DECLINED)
    assert not declined_by_cublas(WRONG)
    assert not declined_by_cublas(ValueError("CUBLAS_STATUS_NOT_SUPPORTED"))


def fp8_call(m=8, n=256, k=512):
    a = torch.randn(m, k).to(torch.float8_e4m3fn)
    b = torch.randn(n, k).to(torch.float8_e4m3fn).t()
    scales = (torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5)
    return a, b, scales, torch.randn(n, dtype=torch.bfloat16)


@pytest.fixture
def torch_raises(monkeypatch):
    """torch._scaled_mm raising `state["error"]` (cuBLASLt declining by default), counting
    its calls in `state["calls"]`."""
    state = {"error": DECLINED, "calls": 0}

    def scaled_mm(*args, **kwargs):
        state["calls"] += 1
        raise state["error"]

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    return state


@pytest.fixture
def ours(monkeypatch):
    """The plan a Dispatcher makes for a scaled call: a launcher that records its arguments
    (or, with `serves` false, none: torch's choice); returns the launches."""
    launches = []
    state = {"serves": True, "launches": launches, "plans": 0}

    def scaled_plan(self, a, b, scale_a, scale_b, out_dtype, *rest):
        state["plans"] += 1
        if not state["serves"]:
            return Plan(None, (), None, reason="torch won the tune")
        shape = (a.shape[0], b.shape[1])
        return Plan(
            lambda *args: launches.append(args), ("workspace",), GemmConfig(), shape,
            (shape[1], 1), out_dtype, a.device,
        )  # fmt: skip

    monkeypatch.setattr(Dispatcher, "_scaled_plan", scaled_plan)
    return state


def test_our_kernel_serves_a_call_cublas_declines(torch_raises, ours):
    d = Dispatcher()
    a, b, (scale_a, scale_b), bias = fp8_call()
    for call in range(2):
        out = d.scaled(a, b, scale_a, scale_b, torch.bfloat16, True, False, bias)
        launched = ours["launches"][call]
        assert launched[:3] == (a, b, out) and out.shape == (8, 256)
        assert launched[-2:] == (bias, "workspace")
    assert torch_raises["calls"] == 1 and ours["plans"] == 1  # the plan serves the next call


@pytest.mark.parametrize("why", ["a wrong call", "torch won the tune"])
def test_torch_keeps_its_error_where_ours_does_not_serve(torch_raises, ours, why):
    if why == "a wrong call":
        torch_raises["error"] = WRONG
    else:
        ours["serves"] = False
    d = Dispatcher()
    a, b, (scale_a, scale_b), bias = fp8_call()
    for _ in range(2):  # no plan is kept: every call is torch's, and raises
        with pytest.raises(RuntimeError) as raised:
            d.scaled(a, b, scale_a, scale_b, torch.bfloat16, True, False, bias)
        assert raised.value is torch_raises["error"]
    assert not ours["launches"] and torch_raises["calls"] == 2
    assert ours["plans"] == (0 if why == "a wrong call" else 2)
