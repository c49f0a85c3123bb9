"""The user API on the GPU: tuning through tuned_gemm, CUDA graph capture of tuned_gemm and of
the custom op, a workspace per stream, the op under torch.compile, several processes on one
bucket, and the examples."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gemmtune.api import dispatch
from gemmtune.api.choice import ConfigChooser
from gemmtune.api.dispatch import Dispatcher
from gemmtune.cache.kernels import KernelCache
from gemmtune.cache.results import ResultsCache
from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels.launch import WORKSPACES
from gemmtune.measure.verify import check

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def test_tuned_gemm_tunes_with_cublas_as_a_candidate_then_hits(tmp_path):
    d = Dispatcher(ConfigChooser(results=ResultsCache(tmp_path / "results.sqlite")))
    d.kernel_caches["sm_90a"] = KernelCache("sm_90a", tmp_path / "kernels")
    a = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16)
    out = d(a, b)
    assert check(out, a.float() @ b.float())[0]
    ((_, record),) = d.chooser.results_cache().items()
    assert "torch.matmul" in record.how and len(record.runners_up) >= 8
    a2 = torch.randn(1800, 1000, device="cuda", dtype=torch.bfloat16)  # same bucket
    b2 = torch.randn(1000, 3000, device="cuda", dtype=torch.bfloat16)
    assert check(d(a2, b2), a2.float() @ b2.float())[0]
    # no second tune: the bucket's configs were checked on the new shape, beside torch.matmul
    bucket, shape = d.chooser.results_cache().items()
    assert bucket[1] == record and shape[0] == d.chooser.shape_key(GemmProblem.from_tensors(a2, b2))
    assert "checked on its shape" in shape[1].how and "torch.matmul" in shape[1].how
    assert shape[1].shape == (1800, 3000, 1000, 1) and shape[1].bucket_tuned_at == record.tuned_at


class FixedChooser(ConfigChooser):
    """Gives every problem one config: no tuning, and the decomposition the test needs."""

    def __init__(self, config: GemmConfig):
        super().__init__()
        self.config = config

    def config_for(self, problem, mode):
        return self.config


CAPTURED_CONFIGS = {
    "data_parallel": GemmConfig(tile_m=128, tile_n=128),
    "split_k": GemmConfig(tile_m=128, tile_n=128, decomposition=Decomposition.SPLIT_K, splits=3),
    "stream_k": GemmConfig(tile_m=128, tile_n=64, decomposition=Decomposition.STREAM_K),
}


def _dispatcher(tmp_path, config: GemmConfig) -> Dispatcher:
    d = Dispatcher(FixedChooser(config))
    d.kernel_caches["sm_90a"] = KernelCache("sm_90a", tmp_path / "kernels")
    return d


@pytest.mark.parametrize("entry", ["tuned_gemm", "op"])
@pytest.mark.parametrize("decomposition", sorted(CAPTURED_CONFIGS))
def test_captured_in_a_cuda_graph_and_replayed(tmp_path, monkeypatch, entry, decomposition):
    d = _dispatcher(tmp_path, CAPTURED_CONFIGS[decomposition])
    monkeypatch.setattr(dispatch, "tuned_gemm", d.gemm)  # what the op calls too
    fn = dispatch.tuned_gemm if entry == "tuned_gemm" else torch.ops.gemmtune.mm
    a = torch.randn(384, 1536, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1536, 640, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (the plan is made) away from the capture
        fn(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(a, b)
    assert d.plans and all(p.launcher is not None for p in d.plans.values())
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ok, err = check(captured, a.float() @ b.float())
        assert ok, f"replay of a captured {decomposition} GEMM: rel err {err}"


@pytest.mark.parametrize("decomposition", sorted(CAPTURED_CONFIGS))
def test_a_captured_call_replays_as_one_kernel(tmp_path, decomposition):
    """Nothing rides along with a captured GEMM: a graph replays every kernel captured, and a
    fill of the workspace's counters had cost each decode GEMM of a stack about 1 µs."""
    from torch.profiler import ProfilerActivity, profile

    d = _dispatcher(tmp_path, CAPTURED_CONFIGS[decomposition])
    a = torch.randn(384, 1536, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1536, 640, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        d.gemm(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [d.gemm(a, b) for _ in range(3)]
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert len(kernels) == 3 and all("HopperGemm" in name for name in kernels), kernels
    assert all(check(out, a.float() @ b.float())[0] for out in outs)


#: a decode tile: the weight is the swapped kernel's A
DECODE_CONFIG = GemmConfig(
    tile_m=64, tile_n=16, swap_ab=True, schedule="pingpong", stage_k_bytes=256, cluster_m=2
)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("decomposition", [*sorted(CAPTURED_CONFIGS), "decode"])
def test_constant_weights_in_a_stack_read_each_input_after_the_layer_before(
    tmp_path, decomposition, graph
):
    """Layers whose input is the output of the layer before, the weights declared constant: a
    kernel loads its weight before the kernel ahead of it finishes, and its input only after."""
    config = CAPTURED_CONFIGS.get(decomposition, DECODE_CONFIG)
    d = _dispatcher(tmp_path, config)
    rows = 16 if config.swap_ab else 384
    width = 1536
    weights = [
        torch.randn(width, width, device="cuda", dtype=torch.bfloat16) / width**0.5
        for _ in range(6)
    ]
    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)

    def layers():
        outs = [x]
        for w in weights:
            outs.append(d.gemm(outs[-1], w.t(), constant_b=True))
        return outs

    outs = layers()  # plans made eagerly
    if graph:
        graph_ = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph_):
            outs = layers()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        if graph:
            for out in outs[1:]:
                out.fill_(float("nan"))
            graph_.replay()
        else:
            outs = layers()
        torch.cuda.synchronize()
        for w, given, out in zip(weights, outs, outs[1:], strict=False):
            ok, err = check(out, given.float() @ w.t().float())
            assert ok, f"{decomposition}: rel err {err}"
    (key,) = [k for k in d.plans if isinstance(k, tuple)]
    assert key[-1] is True  # the plan of a constant b


def test_a_graph_keeps_its_workspace_when_the_pool_grows_and_the_first_graph_is_gone(
    tmp_path, monkeypatch
):
    """A split-K plan captured in two graphs, the first graph then deleted, and a plan that
    needs a larger workspace captured after them: the second graph still computes its product
    and writes nowhere else (memory handed out since keeps its values). Shared through the
    pool, its workspace was one the first capture had allocated, freed when the pool grew."""
    d = _dispatcher(tmp_path, CAPTURED_CONFIGS["split_k"])
    monkeypatch.setattr(dispatch, "tuned_gemm", d.gemm)
    a, b = (torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in ((384, 1536), (1536, 640)))
    big_a = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    big_b = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)  # more tiles, partials
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the plans, away from the captures
        d(a, b)
        d(big_a, big_b)
    torch.cuda.current_stream().wait_stream(side)
    first, second, third = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        d(a, b)
    with torch.cuda.graph(second):
        captured = d(a, b)
    del first
    with torch.cuda.graph(third):
        big = d(big_a, big_b)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    fillers = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(64)]
    for _ in range(2):
        captured.fill_(float("nan"))
        big.fill_(float("nan"))
        second.replay()
        third.replay()
        torch.cuda.synchronize()
        assert check(captured, a.float() @ b.float())[0]
        assert check(big, big_a.float() @ big_b.float())[0]
    assert all(bool((f == 7.0).all()) for f in fillers)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("decomposition", sorted(CAPTURED_CONFIGS))
def test_tensors_on_a_gpu_that_is_not_the_current_one(tmp_path, monkeypatch, decomposition):
    """Operands on the second GPU while the first is current: the kernel runs on theirs, with
    a workspace there, called directly and replayed from a graph captured on that GPU."""
    d = _dispatcher(tmp_path, CAPTURED_CONFIGS[decomposition])
    monkeypatch.setattr(dispatch, "tuned_gemm", d.gemm)
    torch.cuda.set_device(0)
    a = torch.randn(384, 1536, device="cuda:1", dtype=torch.bfloat16)
    b = torch.randn(1536, 640, device="cuda:1", dtype=torch.bfloat16)
    expected = a.float() @ b.float()
    out = d(a, b)
    assert out.device == a.device and torch.cuda.current_device() == 0
    assert check(out, expected)[0]
    assert all(p.launcher is not None for p in d.plans.values())
    with torch.cuda.device(1):
        graph = torch.cuda.CUDAGraph()
        # torch's default capture stream belongs to the GPU of the first capture in the process
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            captured = d(a, b)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize(1)
    assert check(captured, expected)[0]


def test_a_shape_met_first_inside_a_capture_is_captured_as_torchs_then_tuned(tmp_path, caplog):
    """A call with no plan inside a capture (mode tune, an empty cache) is served by torch and
    captured so, with a warning; no plan is kept, and the first call outside the capture tunes
    and runs our kernel."""
    d = Dispatcher(ConfigChooser(results=ResultsCache(tmp_path / "results.sqlite")))
    d.kernel_caches["sm_90a"] = KernelCache("sm_90a", tmp_path / "kernels")
    a = torch.randn(384, 1536, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1536, 640, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = d(a, b)
    assert d.plans == {} and "inside a CUDA graph capture" in caplog.text
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert check(captured, a.float() @ b.float())[0]
    assert check(d(a, b), a.float() @ b.float())[0]  # outside: tuned, then kept
    (plan,) = d.plans.values()
    assert plan.reason != "first met inside a CUDA graph capture"


def test_gradients_flow_where_our_kernel_serves(tmp_path, monkeypatch):
    """Operands that require grad: tuned_gemm's result carries autograd's history (through
    `gemmtune::mm`, whose forward and backward run our kernel) and the gradients match
    torch's; under no_grad our kernel serves the call directly."""
    d = _dispatcher(tmp_path, CAPTURED_CONFIGS["data_parallel"])
    monkeypatch.setattr(dispatch, "tuned_gemm", d.gemm)  # what the op calls
    a = torch.randn(384, 1536, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(1536, 640, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = d(a, b)
    assert out.grad_fn is not None and check(out, a.float() @ b.float())[0]
    grad = torch.randn_like(out)
    out.backward(grad)
    assert check(a.grad, grad.float() @ b.detach().float().t())[0]
    assert check(b.grad, a.detach().float().t() @ grad.float())[0]
    with torch.no_grad():
        assert d(a, b).grad_fn is None
    assert d.plan(a, b).launcher is not None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_operands_whose_strides_tma_cannot_take_run_on_padded_copies(tmp_path, dtype):
    """`x @ w` of a row-major weight whose rows are 4,200 bytes, and a column-major `x` whose
    columns are 2,002: our kernel serves both on K-major copies (`GemmProblem.copied`), and
    the same dispatcher's aligned call reads its operands as they are."""
    d = _dispatcher(tmp_path, GemmConfig(tile_m=128, tile_n=128))
    w = torch.randn(2000, 2100, device="cuda", dtype=dtype)[:, :2096]
    row_major = torch.randn(1001, 2000, device="cuda", dtype=dtype)
    column_major = torch.randn(2000, 1001, device="cuda", dtype=dtype).t()
    for x, copied in ((row_major, ("b",)), (column_major, ("a", "b"))):
        plan = d.plan(x, w)
        assert plan.launcher is not None, plan.reason
        out = d(x, w)
        ok, err = check(out, x.float() @ w.float())
        assert ok, f"{copied}: rel err {err}"
    aligned = w.contiguous()
    assert check(d(row_major, aligned), row_major.float() @ aligned.float())[0]


def test_concurrent_streams_get_their_own_workspace(tmp_path):
    d = _dispatcher(tmp_path, CAPTURED_CONFIGS["split_k"])
    streams = [torch.cuda.Stream() for _ in range(2)]
    operands = [
        (
            torch.randn(512, 8192, device="cuda", dtype=torch.bfloat16),
            torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16),
        )
        for _ in streams
    ]
    expected = [a.float() @ b.float() for a, b in operands]
    torch.cuda.synchronize()
    for _ in range(20):  # the two streams' split-K launches overlap on the GPU
        outs = []
        for stream, (a, b) in zip(streams, operands, strict=True):
            with torch.cuda.stream(stream):
                outs.append(d(a, b))
        torch.cuda.synchronize()
        for out, ref in zip(outs, expected, strict=True):
            assert check(out, ref)[0]
    ids = {stream.stream_id for stream in streams}
    held = {key[1] for key in WORKSPACES.buffers if key[1] in ids}
    assert held == ids  # one workspace per stream


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
    assert any(p.launcher is not None for p in DISPATCHER.plans.values())


@pytest.mark.parametrize(
    "script, args",
    [
        ("quickstart.py", []),
        ("pretune_model_shapes.py", ["--batch-sizes", "128"]),
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
