"""fp8 on the GPU: `gemmtune.scaled_mm` and its op against torch._scaled_mm (fast accumulation)
and the dequantized float32 product, our kernel serving where it can (the plan says so),
torch's errors where torch._scaled_mm refuses a wrong call, our kernel where cuBLASLt declines
a valid one, fp8 through tuned_gemm with unit scales, and a
compiled function whose _scaled_mm runs through the op."""

import pytest
import torch

from gemmtune.core.device import Arch, arch_of
from gemmtune.core.problem import scaled_reference
from gemmtune.measure.verify import relative_error, tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def fp8(*shape, dtype=E4M3):
    return torch.randn(shape, device="cuda").to(dtype)


def scales(m, n, scaling):
    if scaling == "row":
        return torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    return torch.tensor(0.8, device="cuda"), torch.tensor(1.25, device="cuda")


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize(
    ("m", "n", "k", "b_dtype"),
    [
        (16, 4096, 4096, E4M3),
        (1000, 1520, 2064, E4M3),
        (4096, 4096, 4096, E4M3),
        (128, 14336, 4096, E5M2),
    ],
)
def test_scaled_mm_on_our_kernel(monkeypatch, scaling, m, n, k, b_dtype):
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")  # the model's first choice, untuned
    a, w = fp8(m, k), fp8(n, k, dtype=b_dtype)
    sa, sb = scales(m, n, scaling)
    options = {"out_dtype": torch.bfloat16, "use_fast_accum": True}
    reference = scaled_reference(a, w.t(), sa, sb)
    for _ in range(2):  # the first call of a signature is torch's; the second ours
        got = gemmtune.scaled_mm(a, w.t(), sa, sb, **options)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    err = relative_error(got, reference)
    assert err <= tolerance(torch.bfloat16, E4M3), err
    theirs = torch._scaled_mm(a, w.t(), sa, sb, **options)
    assert err <= 2 * relative_error(theirs, reference) + 1e-3
    assert torch.equal(torch.ops.gemmtune.scaled_mm(a, w.t(), sa, sb, **options), got)
    if arch_of(0) is Arch.SM90:
        plan = gemmtune.api.dispatch.DISPATCHER.scaled_plan(a, w.t(), sa, sb, torch.bfloat16)
        assert plan is not None and plan.config is not None


def test_scaled_mm_fails_where_torch_scaled_mm_does():
    import gemmtune

    a, w = fp8(64, 128), fp8(32, 128)
    one = torch.tensor(1.0, device="cuda")
    bad_calls = [
        (a, w.t().contiguous(), one, one),  # b row-major
        (fp8(64, 120), fp8(32, 120).t(), one, one),  # k not a multiple of 16
        (a, w.t(), torch.ones(3, device="cuda"), one),  # a scale of neither kind
    ]
    for args in bad_calls:
        with pytest.raises(RuntimeError) as theirs:
            torch._scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=True)
        with pytest.raises(RuntimeError) as ours:
            gemmtune.scaled_mm(*args, out_dtype=torch.bfloat16, use_fast_accum=True)
        assert str(ours.value) == str(theirs.value)


@pytest.mark.skipif(
    torch.cuda.is_available() and arch_of(0) is not Arch.SM90,
    reason="the Hopper kernel alone adds a bias",
)
def test_a_call_cublaslt_declines_is_served_by_our_kernel(monkeypatch):
    """torch._scaled_mm with per-row scales and a bias on the 8B down projection at 16 rows:
    torch checks the call, cuBLASLt finds no algorithm (CUBLAS_STATUS_NOT_SUPPORTED on an
    H200 with torch 2.11); our kernel answers it from the first call."""
    import gemmtune
    from gemmtune.core.problem import declined_by_cublas

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    m, n, k = 16, 4096, 14336
    a, w = fp8(m, k), fp8(n, k)
    sa, sb = scales(m, n, "row")
    bias = (torch.randn(n, device="cuda") * k**0.5).to(torch.bfloat16)
    options = {"out_dtype": torch.bfloat16, "use_fast_accum": True, "bias": bias}
    try:
        torch._scaled_mm(a, w.t(), sa, sb, **options)
    except RuntimeError as error:
        assert declined_by_cublas(error), error
    else:
        pytest.skip("this torch and cuBLASLt take the call")
    reference = scaled_reference(a, w.t(), sa, sb) + bias.float()
    for _ in range(2):
        got = gemmtune.scaled_mm(a, w.t(), sa, sb, **options)
        err = relative_error(got, reference)
        assert got.shape == (m, n) and err <= tolerance(torch.bfloat16, E4M3), err
    plan = gemmtune.api.dispatch.DISPATCHER.scaled_plan(
        a, w.t(), sa, sb, torch.bfloat16, True, False, bias
    )
    assert plan is not None and plan.config is not None


def test_calls_ours_does_not_serve_are_torch_scaled_mm():
    import gemmtune

    a, w = fp8(256, 512), fp8(384, 512)
    sa, sb = scales(256, 384, "tensor")
    options = {"out_dtype": torch.float8_e4m3fn, "use_fast_accum": True}  # an fp8 output
    got = gemmtune.scaled_mm(a, w.t(), sa, sb, **options)
    assert torch.equal(got, torch._scaled_mm(a, w.t(), sa, sb, **options))


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_precise_accumulation_is_served_by_a_promoting_kernel(monkeypatch, scaling):
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    m, n, k = 1000, 1536, 8192
    a, w = fp8(m, k), fp8(n, k)
    sa, sb = scales(m, n, scaling)
    options = {"out_dtype": torch.float32}  # use_fast_accum=False, torch's default
    reference = scaled_reference(a, w.t(), sa, sb)
    for _ in range(2):
        got = gemmtune.scaled_mm(a, w.t(), sa, sb, **options)
    theirs = torch._scaled_mm(a, w.t(), sa, sb, **options)
    err, their_err = relative_error(got, reference), relative_error(theirs, reference)
    assert err <= 2 * their_err + 1e-6, (err, their_err)
    if arch_of(0) is Arch.SM90:
        plan = gemmtune.api.dispatch.DISPATCHER.scaled_plan(
            a, w.t(), sa, sb, torch.float32, use_fast_accum=False
        )
        assert plan is not None and plan.config is not None


def test_tuned_gemm_multiplies_fp8_with_unit_scales(monkeypatch):
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    a, w = fp8(300, 512), fp8(200, 512, dtype=E5M2)
    # the layout 8-bit MMAs read, then b row-major and a column-major: copied K-major first
    for x, y in ((a, w.t()), (a, w.t().contiguous()), (a.t().contiguous().t(), w.t())):
        got = gemmtune.tuned_gemm(x, y, out_dtype=torch.float32)
        err = relative_error(got, torch.matmul(x.float(), y.float()))
        assert got.dtype == torch.float32 and err <= tolerance(torch.float32, E4M3), err
        if arch_of(0) is Arch.SM90:
            assert gemmtune.plan(x, y, out_dtype=torch.float32).config is not None
    assert gemmtune.tuned_gemm(a, w.t()).dtype == torch.bfloat16


def test_compiled_scaled_mm_runs_through_the_op(monkeypatch, inductor_post_pass):
    import gemmtune
    from gemmtune.api import dispatch

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    calls = []
    real = dispatch.scaled_mm
    monkeypatch.setattr(
        dispatch, "scaled_mm", lambda *args, **kw: calls.append(1) or real(*args, **kw)
    )
    gemmtune.install_inductor_pass()
    torch._dynamo.reset()

    def f(x, w, sa, sb):
        y = torch._scaled_mm(x, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
        return y.relu()

    a, w = fp8(128, 256), fp8(512, 256)
    sa, sb = scales(128, 512, "row")
    compiled = torch.compile(f)
    compiled(a, w, sa, sb)  # torch answers a signature's first call, ours the next
    got = compiled(a, w, sa, sb)
    torch._dynamo.reset()
    assert len(calls) == 2
    expected = f(a, w, sa, sb)
    assert relative_error(got, expected.float()) <= tolerance(torch.bfloat16, E4M3)
