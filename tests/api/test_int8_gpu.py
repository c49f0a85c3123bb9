"""int8 on the GPU: `gemmtune.int_mm`, `tuned_gemm` and the op bit for bit against torch's exact
int32 products, our kernel serving where it can (the plan says so), torch's errors where
torch._int_mm refuses, and a tune of an int8 bucket."""

import pytest
import torch

from gemmtune.core.device import Arch, arch_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def randint8(*shape):
    return torch.randint(-128, 128, shape, device="cuda", dtype=torch.int8)


def exact(a, b):
    return torch.matmul(a.double(), b.double()).to(torch.int32)


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (17, 4096, 4096),
        (32, 8192, 1024),
        (1000, 1528, 2064),
        (4096, 4096, 4096),
        (128, 14336, 4096),
    ],
)
def test_int_mm_is_bit_exact_on_our_kernel(monkeypatch, m, n, k):
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")  # the model's first choice, untuned
    a, w = randint8(m, k), randint8(n, k)
    got = gemmtune.int_mm(a, w.t())
    assert got.dtype == torch.int32 and torch.equal(got, torch._int_mm(a, w.t()))
    assert torch.equal(torch.ops.gemmtune.int_mm(a, w.t()), got)
    if arch_of(0) is Arch.SM90:
        assert gemmtune.plan(a, w.t()).config is not None


def test_int_mm_fails_where_torch_int_mm_does():
    import gemmtune

    for a, b in ((randint8(16, 64), randint8(32, 64).t()), (randint8(64, 60), randint8(60, 32))):
        with pytest.raises(RuntimeError) as theirs:
            torch._int_mm(a, b)
        with pytest.raises(RuntimeError) as ours:
            gemmtune.int_mm(a, b)
        assert str(ours.value) == str(theirs.value)


def test_tuned_gemm_multiplies_any_int8_layout_exactly(monkeypatch):
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    a, w = randint8(300, 512), randint8(200, 512)
    cases = [
        (a, w.t()),  # our kernel's layout
        # 8-bit MMAs read K-major: the other layouts run on K-major copies, ragged ones too
        (a, w.t().contiguous()),  # b row-major: x @ w
        (a.t().contiguous().t(), w.t()),  # a column-major
        (a.t().contiguous().t(), w.t().contiguous()),  # both
        (randint8(300, 77).t(), randint8(300, 5)),  # rows of 300 and 5 bytes, copied padded
        (randint8(1, 512), w.t()),  # one row: torch._int_mm refuses it, ours takes it
        (randint8(3, 64, 512), randint8(3, 96, 512).transpose(1, 2)),  # batched
        (randint8(3, 64, 528), randint8(3, 528, 96)),  # batched, b row-major
    ]
    for x, y in cases:
        got = gemmtune.tuned_gemm(x, y)
        assert got.dtype == torch.int32 and torch.equal(got, exact(x, y))
        out = torch.full(got.shape, -7, device="cuda", dtype=torch.int32)
        assert torch.equal(gemmtune.tuned_gemm(x, y, out=out), got)
        if arch_of(0) is Arch.SM90:
            assert gemmtune.plan(x, y).config is not None, (x.shape, x.stride(), y.stride())


@pytest.mark.skipif(
    torch.cuda.is_available() and arch_of(0) is not Arch.SM90, reason="tunes the Hopper kernel"
)
def test_a_row_major_int8_weight_tunes_to_our_kernel_on_a_copy(tmp_path):
    from gemmtune.api.choice import ConfigChooser
    from gemmtune.api.dispatch import Dispatcher
    from gemmtune.cache.kernels import KernelCache
    from gemmtune.cache.results import ResultsCache
    from gemmtune.core.config import CUBLAS

    d = Dispatcher(ConfigChooser(results=ResultsCache(tmp_path / "results.sqlite")))
    d.kernel_caches["sm_90a"] = KernelCache("sm_90a", tmp_path / "kernels")
    x, w = randint8(2048, 4096), randint8(4096, 4096)  # w row-major (k, n): x @ w
    assert torch.equal(d(x, w), torch._int_mm(x, w))
    # every candidate was timed with the copy of w, beside torch._int_mm on w as given
    ((key, record),) = d.chooser.results_cache().items()
    assert key.split("|")[1].endswith("_copy_b") and "torch.matmul" in record.how
    assert record.config != CUBLAS, record
    assert d.plan(x, w).config is not None


@pytest.mark.skipif(
    torch.cuda.is_available() and arch_of(0) is not Arch.SM90, reason="tunes the Hopper kernel"
)
def test_an_int8_bucket_tunes_to_a_verified_kernel(tmp_path):
    from gemmtune.tuning.tuner import tune

    a, w = randint8(2048, 4096), randint8(4096, 4096)
    result = tune(a, w.t(), top_k=6, kernel_dir=tmp_path, progress=False, cublas=True)
    assert result.best is not None and not result.failures, result.failures
    assert result.reference_error == 0.0


def test_constant_int8_weights_in_a_stack_stay_exact(monkeypatch):
    """Layers of int8 weights declared constant, each input written by the kernel before (the
    int32 product of the layer before, clamped to int8): every product bit for bit."""
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")
    weights = [randint8(4096, 4096) for _ in range(4)]
    x = randint8(32, 4096)
    inputs, outputs = [], []
    for w in weights:
        inputs.append(x)
        outputs.append(gemmtune.int_mm(x, w.t(), constant_b=True))
        x = (outputs[-1] >> 16).clamp(-128, 127).to(torch.int8)
    torch.cuda.synchronize()
    assert gemmtune.plan(inputs[0], weights[0].t(), constant_b=True).config is not None
    for given, w, out in zip(inputs, weights, outputs, strict=True):
        assert torch.equal(out, exact(given, w.t()))
