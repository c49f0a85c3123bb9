"""tuned_gemm's bias on a Hopper GPU: our kernel adds a linear layer's bias (2-D and batched,
both weight layouts, decode rows on swapped binaries, a float32 output, fp8 inputs); other
biases are added to our product; int8's exactly; a tune times the biased bucket; gradients,
a CUDA graph and TunedLinear."""

import pytest
import torch

from gemmtune.api import dispatch
from gemmtune.api.bias import addmm
from gemmtune.api.choice import ConfigChooser
from gemmtune.api.dispatch import Dispatcher
from gemmtune.cache.results import ResultsCache
from gemmtune.core.device import Arch, arch_of
from gemmtune.measure.verify import check, poison

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(
        torch.cuda.is_available() and arch_of(0) is not Arch.SM90,
        reason="the Hopper kernel alone adds a bias",
    ),
]

BF16, FP16 = torch.bfloat16, torch.float16


@pytest.fixture
def d(tmp_path):
    """A dispatcher with its own results cache (kernels: the user's cache)."""
    return Dispatcher(ConfigChooser(results=ResultsCache(tmp_path / "results.sqlite")))


def operands(m, n, k, layout, dtype, batch=None):
    lead = () if batch is None else (batch,)
    a = torch.randn(*lead, m, k, device="cuda", dtype=dtype)
    if layout == "nk":  # x @ w.t() of a row-major weight
        b = torch.randn(*lead, n, k, device="cuda", dtype=dtype).transpose(-1, -2)
    else:
        b = torch.randn(*lead, k, n, device="cuda", dtype=dtype)
    return a, b


def column_bias(n, k, dtype):
    """randn times the square root of K: as large as the product's elements, so that a result
    without it fails the check."""
    return (torch.randn(n, device="cuda") * k**0.5).to(dtype)


def assert_biased(out, a, b, bias):
    reference = a.float() @ b.float() + bias.float()
    ok, err = check(out, reference, a.dtype)
    assert ok, f"rel err {err}"
    assert not check(out.float() - bias.float(), reference, a.dtype)[0]


@pytest.mark.parametrize(
    ("m", "n", "k", "layout", "dtype", "batch"),
    [
        (1001, 1528, 2064, "nk", BF16, None),
        (264, 392, 208, "kn", FP16, None),
        (8, 4096, 4096, "nk", BF16, None),  # decode: a swapped binary adds it along its rows
        (256, 384, 512, "kn", BF16, 4),  # one bias for every matrix of the batch
    ],
    ids=["ragged-nk", "small-kn-fp16", "decode-nk", "batched-kn"],
)
def test_our_kernel_adds_a_linear_layers_bias(d, m, n, k, layout, dtype, batch):
    a, b = operands(m, n, k, layout, dtype, batch)
    bias = column_bias(n, k, dtype)
    plan = d.plan(a, b, mode="heuristic", bias=bias)
    assert plan.launcher is not None and plan.config is not None, plan.reason
    out = d(a, b, bias=bias, mode="heuristic")
    assert_biased(out, a, b, bias)
    given = torch.empty_like(out)
    poison(given)
    assert d(a, b, bias=bias, out=given, mode="heuristic") is given
    assert_biased(given, a, b, bias)


def test_a_float32_output_takes_a_float32_bias_in_the_kernel(d):
    a, b = operands(520, 768, 1024, "nk", BF16)
    bias = column_bias(768, 1024, torch.float32)
    assert d.plan(a, b, out_dtype=torch.float32, mode="heuristic", bias=bias).launcher
    out = d(a, b, out_dtype=torch.float32, bias=bias, mode="heuristic")
    assert out.dtype == torch.float32
    assert_biased(out, a, b, bias)


def test_fp8_inputs_take_the_bias_after_their_unit_scales(d):
    a = torch.randn(512, 1024, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(768, 1024, device="cuda").to(torch.float8_e4m3fn).t()
    bias = column_bias(768, 1024, BF16)
    plan = d.plan(a, b, mode="heuristic", bias=bias)
    assert plan.launcher is not None and plan.bias_at == 2, plan.reason
    assert_biased(d(a, b, bias=bias, mode="heuristic"), a, b, bias)


@pytest.mark.parametrize("shape", ["matrix", "float32", "strided"])
def test_other_biases_are_added_to_our_product(d, shape):
    a, b = operands(300, 520, 640, "nk", BF16)
    bias = {
        "matrix": torch.randn(300, 520, device="cuda", dtype=BF16) * 25,
        "float32": column_bias(520, 640, torch.float32),
        "strided": column_bias(1040, 640, BF16)[::2],
    }[shape]
    plan = d.plan(a, b, mode="heuristic", bias=bias)
    assert plan.launcher is None and plan.torch_op is None
    out = d(a, b, bias=bias, mode="heuristic")
    assert out.dtype == BF16 and d.plan(a, b, mode="heuristic").launcher is not None
    assert_biased(out, a, b, bias)


def test_int8_takes_an_int32_bias_exactly(d):
    a = torch.randint(-128, 128, (64, 512), device="cuda", dtype=torch.int8)
    w = torch.randint(-128, 128, (256, 512), device="cuda", dtype=torch.int8)
    bias = torch.randint(-(2**20), 2**20, (256,), device="cuda", dtype=torch.int32)
    out = d(a, w.t(), bias=bias, mode="heuristic")
    assert torch.equal(out, torch._int_mm(a, w.t()) + bias)


def test_a_tune_times_the_biased_bucket_against_torch_addmm(d):
    a, b = operands(16, 4096, 4096, "nk", BF16)
    bias = column_bias(4096, 4096, BF16)
    out = d(a, b, bias=bias)
    assert_biased(out, a, b, bias)
    ((key, record),) = d.chooser.results_cache().items()
    assert "_bias|" in key and "torch.matmul" in record.how
    plan = d.plan(a, b, bias=bias)
    assert plan.launcher is not None or plan.torch_op is addmm


def test_gradients_of_a_biased_call(d, monkeypatch):
    monkeypatch.setattr(dispatch, "tuned_gemm", d.gemm)  # what the op calls
    a, b = operands(384, 640, 1536, "nk", BF16)
    bias = column_bias(640, 1536, BF16)
    for t in (a, b, bias):
        t.requires_grad_()
    out = d(a, b, bias=bias, mode="heuristic")
    assert out.grad_fn is not None
    assert_biased(out.detach(), a.detach(), b.detach(), bias.detach())
    grad = torch.randn_like(out)
    out.backward(grad)
    assert check(bias.grad, grad.float().sum(0))[0]
    assert check(a.grad, grad.float() @ b.detach().float().t())[0]
    assert check(b.grad, a.detach().float().t() @ grad.float())[0]


def test_a_biased_call_captured_in_a_cuda_graph(d):
    a, b = operands(384, 1536, 640, "nk", BF16)
    bias = column_bias(1536, 640, BF16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the plan is made away from the capture
        d(a, b, bias=bias, mode="heuristic")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = d(a, b, bias=bias, mode="heuristic")
    for _ in range(2):
        bias.copy_(column_bias(1536, 640, BF16))
        a.copy_(torch.randn_like(a))
        poison(captured)
        graph.replay()
        torch.cuda.synchronize()
        assert_biased(captured, a, b, bias)


def test_tuned_linear_adds_its_bias_in_our_kernel(monkeypatch):
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    layer = torch.nn.Linear(1024, 768, device="cuda", dtype=BF16)
    with torch.no_grad():
        layer.bias.copy_(column_bias(768, 1024, BF16))
    x = torch.randn(4, 50, 1024, device="cuda", dtype=BF16)
    expected = layer(x)
    model = torch.nn.Sequential(layer)
    assert gemmtune.use_tuned_linear(model) == 1
    with torch.no_grad():
        got = model(x)
    ok, err = check(got, expected.float())
    assert ok, f"rel err {err}"
    rows = x.reshape(-1, 1024)
    assert dispatch.plan(rows, layer.weight.t(), bias=layer.bias).launcher is not None


def test_a_pretuned_biased_layer_is_the_bucket_its_calls_meet(d, monkeypatch):
    import gemmtune
    from gemmtune.core.config import CUBLAS
    from gemmtune.core.problem import GemmProblem

    monkeypatch.setattr(dispatch, "DISPATCHER", d)  # what pretune tunes into
    layer = torch.nn.Linear(4096, 1024, device="cuda", dtype=BF16)
    outcome = gemmtune.pretune(layer, batch_sizes=[16], progress=False)
    assert outcome.tuned == 1
    ((key, record),) = d.chooser.results_cache().items()
    assert "_bias|" in key
    x = torch.randn(16, 4096, device="cuda", dtype=BF16)
    w, bias = layer.weight.detach(), layer.bias.detach()
    assert d.chooser.bucket_key(GemmProblem.from_tensors(x, w.t(), bias=True)) == key
    out = d(x, w.t(), bias=bias, mode="cache-only")
    assert_biased(out, x, w.t(), bias)
    plan = d.plan(x, w.t(), bias=bias, mode="cache-only")
    assert (plan.config.key if plan.config else CUBLAS) == record.config
    assert d.chooser.results_cache().items() == [(key, record)]


def test_the_cli_tunes_a_biased_bucket(tmp_path):
    import json
    import os
    import subprocess
    import sys

    command = ["tune", "--shape", "16x1024x4096", "--layout", "tt", "--bias", "--top-k", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "gemmtune", *command, "--json"],
        capture_output=True,
        text=True,
        timeout=500,
        env={**os.environ, "GEMMTUNE_CACHE_DIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["problem"]["bias"] and report["timed"] >= 2
    keys = [key for key, _ in ResultsCache(tmp_path / "results.sqlite").items()]
    assert len(keys) == 1 and "_bias|" in keys[0]
