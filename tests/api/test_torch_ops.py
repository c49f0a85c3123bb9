"""gemmtune::mm and TunedLinear on the CPU, where the op computes with torch.matmul: the
schema, the fake implementation, gradients, torch.compile, and the layer swap."""

import pytest
import torch
from torch import nn

import gemmtune
from gemmtune.api.torch_ops import TunedLinear


def test_the_op_passes_torch_checks():
    for a, b in [((8, 16), (16, 4)), ((3, 8, 16), (3, 16, 4))]:
        args = (torch.randn(a, requires_grad=True), torch.randn(b, requires_grad=True))
        torch.library.opcheck(torch.ops.gemmtune.mm.default, args)


def test_the_op_with_a_bias_passes_torch_checks():
    a, b = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    for bias in (torch.randn(4), torch.randn(8, 1), torch.randn(8, 4)):
        bias.requires_grad_()
        torch.library.opcheck(torch.ops.gemmtune.mm.default, (a, b, None, False, bias))


def test_gradients_match_torch_matmul():
    a = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(16, 4, dtype=torch.float64, requires_grad=True)  # broadcast over the batch
    torch.autograd.gradcheck(lambda a, b: torch.ops.gemmtune.mm(a, b), (a, b))


@pytest.mark.parametrize("bias_shape", [(4,), (8, 1), (2, 1, 4)], ids=str)
def test_gradients_with_a_bias_match_torch(bias_shape):
    """The bias's gradient is the output's summed over what the bias was broadcast along."""
    f64 = torch.float64
    a = torch.randn(2, 8, 16, dtype=f64, requires_grad=True)
    b = torch.randn(2, 16, 4, dtype=f64, requires_grad=True)
    bias = torch.randn(bias_shape, dtype=f64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda a, b, bias: torch.ops.gemmtune.mm(a, b, None, False, bias), (a, b, bias)
    )


def test_fake_implementation_gives_shape_and_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = (
            torch.empty(5, 8, 16, dtype=torch.bfloat16),
            torch.empty(5, 16, 4, dtype=torch.bfloat16),
        )
        out = torch.ops.gemmtune.mm(a, b, out_dtype=torch.float32)
        assert out.shape == (5, 8, 4) and out.dtype == torch.float32
        with pytest.raises(ValueError, match="inner dimensions"):
            torch.ops.gemmtune.mm(a, torch.empty(8, 4, dtype=torch.bfloat16))
        bias = torch.empty(4, dtype=torch.bfloat16)
        assert torch.ops.gemmtune.mm(a, b, bias=bias).shape == (5, 8, 4)
        with pytest.raises(ValueError, match="does not broadcast"):
            torch.ops.gemmtune.mm(a, b, bias=torch.empty(8, dtype=torch.bfloat16))


def test_linear_layers_are_swapped_in_place_and_compile():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Sequential(nn.Linear(32, 4, bias=False)))
    x = torch.randn(2, 3, 16)
    expected, keys = model(x), list(model.state_dict())
    assert gemmtune.use_tuned_linear(model) == 2
    assert isinstance(model[0], TunedLinear) and isinstance(model[2][0], TunedLinear)
    assert list(model.state_dict()) == keys  # same parameters, same names
    torch.testing.assert_close(model(x), expected)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), expected)


def test_scaled_mm_off_the_gpu_is_torch_scaled_mm_and_its_fake_gives_shape_and_dtype(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gemmtune.api.dispatch import DISPATCHER

    monkeypatch.setattr(DISPATCHER, "scaled", lambda *args, **kw: pytest.fail("planned"))
    plans = dict(DISPATCHER.plans)

    a = torch.randn(32, 64).to(torch.float8_e4m3fn)
    b = torch.randn(16, 64).to(torch.float8_e4m3fn).t()
    scales = (torch.tensor(0.5), torch.tensor(2.0))
    options = {"out_dtype": torch.bfloat16, "use_fast_accum": True}
    expected = torch._scaled_mm(a, b, *scales, **options)
    for _ in range(2):  # a CPU call makes no plan and never reaches a kernel
        assert torch.equal(gemmtune.scaled_mm(a, b, *scales, **options), expected)
    assert torch.equal(torch.ops.gemmtune.scaled_mm(a, b, *scales, **options), expected)
    assert DISPATCHER.plans == plans
    # opcheck's schema test multiplies the inputs, which fp8 tensors do not allow on the CPU
    torch.library.opcheck(
        torch.ops.gemmtune.scaled_mm.default,
        (a, b, *scales),
        options,
        test_utils=("test_faketensor", "test_autograd_registration"),
    )
    with FakeTensorMode():
        fa = torch.empty(8, 64, dtype=torch.float8_e4m3fn)
        fb = torch.empty(64, 24, dtype=torch.float8_e5m2)
        out = torch.ops.gemmtune.scaled_mm(fa, fb, torch.empty(()), torch.empty(()))
        assert out.shape == (8, 24) and out.dtype == torch.float8_e4m3fn  # torch's default
        with pytest.raises(ValueError, match="inner dimensions"):
            torch.ops.gemmtune.scaled_mm(fa, fa, torch.empty(()), torch.empty(()))
