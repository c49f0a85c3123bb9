"""tuned_gemm's bias on the CPU: which route a bias takes (our kernel's epilogue, torch.addmm,
or added after our product), the plan key, where the launch puts the bias, gradients, and
wrong calls. GPUs are faked (`_on_a_faked_gpu`); tensors stay on the CPU."""

import pytest
import torch
from test_api import H200, TUNED, FakeTuner, RecordingKernels, _on_a_faked_gpu

from gemmtune.api import bias as bias_module
from gemmtune.api.bias import BiasFacts, bias_plan_key, check_bias, fuses, torch_adds
from gemmtune.api.choice import ConfigChooser
from gemmtune.api.dispatch import NATIVE_SIGNATURE, Dispatcher, Plan, plan_key
from gemmtune.cache.results import ResultsCache
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand

BF16 = torch.bfloat16


@pytest.fixture(params=["native", "python"])
def dispatcher(request, tmp_path):
    if request.param == "native" and NATIVE_SIGNATURE is None:
        pytest.skip("the _signature extension is not built")
    chooser = ConfigChooser(
        results=ResultsCache(tmp_path / "r.sqlite"), tuner=FakeTuner(), environment=lambda i: H200
    )
    return Dispatcher(chooser, NATIVE_SIGNATURE if request.param == "native" else None)


@pytest.fixture
def faked_gpu(monkeypatch):
    """`_on_a_faked_gpu` with biases described on GPU 0 too; returns the arch setter."""

    def on(arch):
        _on_a_faked_gpu(monkeypatch, arch)
        monkeypatch.setattr(
            BiasFacts,
            "of",
            classmethod(
                lambda cls, t: cls(tuple(t.shape), t.stride(), t.dtype, torch.device("cuda", 0))
            ),
        )

    return on


def operands(m=64, k=32, n=48, dtype=BF16):
    return torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)


def problem_of(m=64, n=48, k=32, dtype=BF16):
    def operand(rows, cols):
        return Operand((rows, cols), (cols, 1), dtype, torch.device("cuda", 0), 1 << 20)

    return GemmProblem.from_operands(operand(m, k), operand(k, n), arch=Arch.SM90)


def facts(shape, dtype=BF16, stride=None, device=("cuda", 0)):
    stride = stride or tuple(torch.empty(shape).stride())
    return BiasFacts(tuple(shape), stride, dtype, torch.device(*device))


def test_the_kernel_adds_a_contiguous_vector_of_the_outputs_type_on_the_operands_gpu():
    p = problem_of()
    assert fuses(facts((48,)), p)
    assert not fuses(facts((48,), stride=(2,)), p)  # a strided view
    assert not fuses(facts((1, 48)), p)  # a matrix, even of one row
    assert not fuses(facts((64, 48)), p)
    assert not fuses(facts((48,), torch.float32), p)  # not the output's type
    assert not fuses(facts((48,), device=("cuda", 1)), p)
    assert not fuses(facts((48,), torch.int32), problem_of(dtype=torch.int8))
    assert fuses(facts((1,), stride=(7,)), problem_of(n=1))  # one element: any stride


def test_a_bias_must_broadcast_to_the_output():
    for shape in ((48,), (1, 48), (64, 1), (64, 48), ()):
        check_bias(facts(shape), (64, 48))
    for shape in ((47,), (64,), (2, 64, 48), (64, 48, 1)):
        with pytest.raises(ValueError, match="does not broadcast"):
            check_bias(facts(shape), (64, 48))


def test_torch_addmm_serves_only_2d_calls_it_computes_exactly_as_asked():
    a, b = operands()
    assert torch_adds(facts((48,)), a, b, None, None)
    assert not torch_adds(facts((48,), torch.float32), a, b, None, None)
    assert not torch_adds(facts((48,)), a, b, None, torch.float32)
    assert not torch_adds(facts((48,)), a, b, torch.empty(64, 48, dtype=BF16), None)
    assert not torch_adds(facts((48,)), a.expand(2, 64, 32), b.expand(2, 32, 48), None, None)


@pytest.mark.parametrize("signature", [NATIVE_SIGNATURE, None], ids=["native", "python"])
def test_a_biased_key_holds_the_bias_and_no_unbiased_call_shares_it(signature):
    if signature is None and NATIVE_SIGNATURE is None:
        pytest.skip("covered by the python case")
    a, b = operands()
    out = torch.empty(64, 48, dtype=BF16)
    vector, matrix = torch.randn(48, dtype=BF16), torch.randn(64, 48, dtype=BF16)
    keys = [
        plan_key(a, b, None, None, None, signature),
        plan_key(a, b, matrix, None, None, signature),  # an out with a bias's facts
        bias_plan_key(a, b, vector, None, None, None, signature, False),
        bias_plan_key(a, b, matrix, None, None, None, signature, False),
        bias_plan_key(a, b, vector.float(), None, None, None, signature, False),
        bias_plan_key(a, b, vector, out, None, None, signature, False),
        bias_plan_key(a, b, vector, None, None, "tune", signature, False),
        bias_plan_key(a, b, vector, None, None, None, signature, True),
    ]
    assert len(set(keys)) == len(keys)
    same = torch.randn(48, dtype=BF16)
    assert bias_plan_key(a, b, same, None, None, None, signature, False) == keys[2]


def test_a_fusable_bias_gets_the_biased_binary(dispatcher, faked_gpu, monkeypatch):
    faked_gpu(Arch.SM90)
    kernels = RecordingKernels()
    monkeypatch.setattr(dispatcher, "_kernels", lambda problem: kernels)
    monkeypatch.setattr("gemmtune.kernels.launch.launch_args", lambda *args, **kw: ())
    a, b = operands(256, 512, 384)
    plan = dispatcher.plan(a, b, mode="heuristic", bias=torch.randn(384, dtype=BF16))
    assert plan.config is not None and plan.bias_at == 0
    assert [s.bias for s in kernels.signatures] == [True]
    # the unbiased call of the same tensors has its own plan, on the unbiased binary
    dispatcher.plan(a, b, mode="heuristic")
    assert [s.bias for s in kernels.signatures] == [True, False]


@pytest.mark.parametrize(
    ("arch", "bias", "code"),
    [
        (Arch.SM90, torch.randn(64, 48, dtype=BF16), "added after the product"),
        (Arch.SM90, torch.randn(48), "added after the product"),  # fp32 beside a bf16 output
        (Arch.SM100, torch.randn(48, dtype=BF16), "alone adds a bias"),
    ],
    ids=["matrix", "fp32", "blackwell"],
)
def test_a_bias_our_kernel_cannot_add_is_added_to_our_product(
    dispatcher, faked_gpu, monkeypatch, arch, bias, code
):
    faked_gpu(arch)
    a, b = operands()
    plan = dispatcher.plan(a, b, mode="heuristic", bias=bias)
    assert plan.launcher is None and plan.torch_op is None and code in str(plan.reason)
    products = []  # tuned_gemm's products, in its own plans
    monkeypatch.setattr(
        dispatcher, "gemm", lambda a, b, **kw: products.append(kw) or torch.matmul(a, b)
    )
    biased = bias_module.biased_function(dispatcher)
    result = biased(a, b, bias, None, None, "heuristic", False)
    assert len(products) == 1 and products[0]["mode"] == "heuristic"
    expected = a.float() @ b.float() + bias.float()
    torch.testing.assert_close(result.float(), expected, rtol=2e-2, atol=2e-2)


def test_where_torch_serves_the_product_torch_addmm_adds_the_bias(dispatcher, faked_gpu):
    faked_gpu(Arch.OTHER)
    a, b = operands()
    bias = torch.randn(48, dtype=BF16)
    for mode in ("tune", "off"):
        plan = dispatcher.plan(a, b, mode=mode, bias=bias)
        assert plan.launcher is None and plan.torch_op is bias_module.addmm
        assert torch.equal(dispatcher(a, b, bias=bias, mode=mode), torch.addmm(bias, a, b))
    # with out=, torch's product is written into out, then the bias is added to it
    out = torch.full((64, 48), float("nan"), dtype=BF16)
    assert dispatcher(a, b, bias=bias, out=out) is out
    torch.testing.assert_close(out, a @ b + bias, rtol=1e-2, atol=1e-2)
    assert dispatcher.chooser.tuner.calls == 0


def test_a_bias_that_does_not_broadcast_or_is_no_tensor_is_an_error(dispatcher, faked_gpu):
    faked_gpu(Arch.SM90)
    a, b = operands()
    with pytest.raises(ValueError, match="does not broadcast"):
        dispatcher(a, b, bias=torch.randn(64, dtype=BF16))  # one per row: not addmm's
    with pytest.raises(TypeError, match="bias must be a tensor"):
        dispatcher(a, b, bias=0.5)
    assert dispatcher.plans == {}


@pytest.mark.parametrize(
    ("scales", "expected_tail"), [((), ("bias",)), (("sa", "sb"), ("sa", "sb", "bias"))]
)
def test_the_launch_puts_the_bias_after_the_bound_scales(dispatcher, scales, expected_tail):
    a, b = operands()
    bias = torch.randn(48, dtype=BF16)
    launches = []
    plan = Plan(
        lambda *args: launches.append(args), (*scales, "workspace"), TUNED, (64, 48), (48, 1),
        BF16, a.device, bias_at=len(scales),
    )  # fmt: skip
    dispatcher.plans[bias_plan_key(a, b, bias, None, None, None, dispatcher.signature, False)] = (
        plan
    )
    out = dispatcher(a, b, bias=bias)
    (launched,) = launches
    assert launched[:3] == (a, b, out)
    tail = tuple("bias" if x is bias else x for x in launched[3:])
    assert tail == (*expected_tail, "workspace")


def test_a_biased_call_that_wants_gradients_gets_them_for_the_bias_too(dispatcher):
    a = torch.randn(64, 32, requires_grad=True)
    b = torch.randn(32, 48, requires_grad=True)
    bias = torch.randn(48, requires_grad=True)
    launches = []
    plan = Plan(
        lambda *args: launches.append(args), (), TUNED, (64, 48), (48, 1), torch.float32,
        a.device,
    )  # fmt: skip
    key = bias_plan_key(a, b, bias, None, None, None, dispatcher.signature, False)
    dispatcher.plans[key] = plan
    out = dispatcher(a, b, bias=bias)
    assert not launches and out.grad_fn is not None
    grad = torch.randn(64, 48)
    out.backward(grad)
    torch.testing.assert_close(bias.grad, grad.sum(0))
    torch.testing.assert_close(a.grad, grad @ b.detach().t())
    torch.testing.assert_close(b.grad, a.detach().t() @ grad)


def test_no_biased_plan_is_made_inside_a_cuda_graph_capture(dispatcher, faked_gpu, monkeypatch):
    from gemmtune.api import dispatch

    faked_gpu(Arch.OTHER)
    monkeypatch.setattr(dispatch, "capturing", lambda tensor: True)
    a, b = operands()
    bias = torch.randn(48, dtype=BF16)
    torch.testing.assert_close(dispatcher(a, b, bias=bias), a @ b + bias, rtol=1e-2, atol=1e-2)
    assert dispatcher.plans == {}
