"""torch.compile with the Inductor pass on the GPU: a compiled function's linear (addmm), mm
and _int_mm run through gemmtune's ops and give what the uncompiled function gives."""

import pytest
import torch

import gemmtune
from gemmtune.measure.verify import tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_compiled_gemms_run_through_gemmtune(monkeypatch, inductor_post_pass):
    from gemmtune.api import dispatch

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")  # the model's first choice, untuned
    calls = []
    for name in ("tuned_gemm", "int_mm"):
        real = getattr(dispatch, name)
        monkeypatch.setattr(
            dispatch,
            name,
            lambda *args, _real=real, _name=name, **kw: (
                calls.append(_name + "+bias" * (kw.get("bias") is not None)) or _real(*args, **kw)
            ),
        )
    gemmtune.install_inductor_pass()
    torch._dynamo.reset()

    def f(x, w, bias, w2, qa, qw):
        return torch.nn.functional.linear(x, w, bias).relu(), x @ w2, torch._int_mm(qa, qw.t())

    bf16 = torch.bfloat16
    x, w = (
        torch.randn(256, 512, device="cuda", dtype=bf16),
        torch.randn(384, 512, device="cuda", dtype=bf16),
    )
    bias = torch.randn(384, device="cuda", dtype=bf16)
    w2 = torch.randn(512, 128, device="cuda", dtype=bf16)
    qa = torch.randint(-128, 128, (64, 512), device="cuda", dtype=torch.int8)
    qw = torch.randint(-128, 128, (256, 512), device="cuda", dtype=torch.int8)
    got = torch.compile(f)(x, w, bias, w2, qa, qw)
    expected = f(x, w, bias, w2, qa, qw)
    torch._dynamo.reset()
    # two bf16 products, the linear's with its bias, and the int8 one: int_mm, which runs
    # through tuned_gemm
    assert sorted(calls) == ["int_mm", "tuned_gemm", "tuned_gemm", "tuned_gemm+bias"], calls
    for ours, theirs in zip(got[:2], expected[:2], strict=True):
        err = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
        assert err < tolerance(bf16)
    assert torch.equal(got[2], expected[2])


def test_a_frozen_models_weights_are_constant_bs(monkeypatch, inductor_post_pass):
    """Compiled with freezing, an inference model's weights are constants of the graph: its
    products go to tuned_gemm as constant_b and compute what the model computes."""
    import torch._inductor.config as inductor_config

    from gemmtune.api import dispatch

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    monkeypatch.setattr(inductor_config, "freezing", True)
    flags = []
    real = dispatch.tuned_gemm
    monkeypatch.setattr(
        dispatch,
        "tuned_gemm",
        lambda *args, **kw: flags.append(kw.get("constant_b", False)) or real(*args, **kw),
    )
    gemmtune.install_inductor_pass()
    torch._dynamo.reset()
    bf16 = torch.bfloat16
    model = (
        torch.nn.Sequential(
            torch.nn.Linear(512, 768, bias=False), torch.nn.SiLU(), torch.nn.Linear(768, 256)
        )
        .to("cuda", bf16)
        .eval()
    )
    x = torch.randn(16, 512, device="cuda", dtype=bf16)
    with torch.no_grad():
        got = torch.compile(model)(x)
        expected = model(x)
    torch._dynamo.reset()
    assert flags == [True, True], flags
    err = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
    assert err < tolerance(bf16)
