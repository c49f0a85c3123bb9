"""tuned_gemm's modes and caches on the CPU: problems described by Operands, a fake tuner."""

import dataclasses

import pytest
import torch

from gemmtune.api.choice import SWITCH_MARGIN, ConfigChooser
from gemmtune.api.dispatch import NATIVE_SIGNATURE, Dispatcher, resolve_mode, tuned_gemm
from gemmtune.cache.buckets import Environment
from gemmtune.cache.results import ResultsCache
from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand
from gemmtune.space.ranking import FIRST_RASTER, FIRST_SWIZZLE
from gemmtune.tuning.tuner import CandidateResult, TuneResult

H200 = Environment("NVIDIA H200", 132, "0.1.0", "4.8.1")
TUNED = GemmConfig(tile_m=128, tile_n=192, schedule="pingpong", cluster_m=2)


def problem(m, n, k):
    def operand(rows, cols):
        return Operand((rows, cols), (cols, 1), torch.bfloat16, torch.device("cuda", 0), 1 << 20)

    return GemmProblem.from_operands(operand(m, k), operand(k, n), arch=Arch.SM90)


class FakeTuner:
    """Tunes every bucket to TUNED (GemmConfig() second); a check of a shape (`configs` given)
    times what it is given, the last of them fastest."""

    def __init__(self):
        self.calls = 0
        self.checks: list[list[GemmConfig]] = []

    def __call__(self, p, configs=None):
        self.calls += 1
        if configs is not None:
            self.checks.append(configs)
            results = [
                CandidateResult(c, 1.0, 0.3 - 0.01 * i, 1e-3, final_ms=0.3 - 0.01 * i)
                for i, c in enumerate(configs)
            ]
            return TuneResult(p, configs[-1], results[-1].final_ms, 1e-3, results, 1, 0, 0, 0, 1)
        results = [
            CandidateResult(TUNED, 1.0, 0.20, 1e-3, final_ms=0.21),
            CandidateResult(GemmConfig(), 2.0, 0.30, 1e-3, final_ms=0.31),
        ]
        return TuneResult(p, TUNED, 0.21, 1e-3, results, 13824, 2, 1.0, 1.0, 3.0)


@pytest.fixture
def chooser(tmp_path):
    return ConfigChooser(
        results=ResultsCache(tmp_path / "r.sqlite"), tuner=FakeTuner(), environment=lambda i: H200
    )


@pytest.fixture(params=["native", "python"])
def dispatcher(request, chooser):
    """A dispatcher keyed by the C signature and one keyed from Python: both must behave alike."""
    if request.param == "native" and NATIVE_SIGNATURE is None:
        pytest.skip("the _signature extension is not built")
    return Dispatcher(chooser, NATIVE_SIGNATURE if request.param == "native" else None)


def test_tune_mode_tunes_once_per_bucket_then_hits(chooser, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_SHAPE_CHECK", "0")
    assert chooser.config_for(problem(4000, 4000, 4000), "tune") == TUNED
    assert chooser.config_for(problem(4096, 3000, 2100), "tune") == TUNED  # same bucket
    assert chooser.tuner.calls == 1
    ((key, record),) = chooser.results.items()
    assert key.startswith("m4096_n4096_k4096_2d|bf16_bf16_ak_bn_on_2d|NVIDIA H200")
    assert (
        record.config == TUNED.key and record.ms == 0.21 and record.shape == (4000, 4000, 4000, 1)
    )
    assert record.runners_up == ((GemmConfig().key, 0.31),)
    # a new bucket tunes again
    chooser.config_for(problem(4000, 4000, 8000), "tune")
    assert chooser.tuner.calls == 2


def test_cache_only_never_tunes(chooser):
    first_choice = chooser.config_for(problem(4000, 4000, 4000), "cache-only")
    assert chooser.tuner.calls == 0 and chooser.results.items() == []
    assert first_choice.compile_key  # the ranking model's first choice, run in bands
    assert (first_choice.raster, first_choice.swizzle) == (FIRST_RASTER, FIRST_SWIZZLE)
    chooser.config_for(problem(4000, 4000, 4000), "tune")
    assert chooser.config_for(problem(4000, 4000, 4000), "cache-only") == TUNED


def test_heuristic_ignores_the_cache(chooser):
    chooser.config_for(problem(4000, 4000, 4000), "tune")
    heuristic = chooser.config_for(problem(4000, 4000, 4000), "heuristic")
    assert heuristic == ConfigChooser.first_choice(problem(4000, 4000, 4000)) != TUNED
    assert chooser.tuner.calls == 1


def test_results_of_another_gpu_are_tuned_again(tmp_path):
    results = ResultsCache(tmp_path / "r.sqlite")
    tuner = FakeTuner()
    h100 = Environment("NVIDIA H100 80GB HBM3", 132, "0.1.0", "4.8.1")
    ConfigChooser(results, tuner=tuner, environment=lambda i: h100).config_for(
        problem(4000, 4000, 4000), "tune"
    )
    ConfigChooser(results, tuner=tuner, environment=lambda i: H200).config_for(
        problem(4000, 4000, 4000), "tune"
    )
    assert tuner.calls == 2 and len(results.items()) == 2


def test_modes_come_from_the_argument_or_the_environment(monkeypatch):
    monkeypatch.delenv("GEMMTUNE_MODE", raising=False)
    assert resolve_mode(None) == "tune"
    monkeypatch.setenv("GEMMTUNE_MODE", "cache-only")
    assert resolve_mode(None) == "cache-only" and resolve_mode("off") == "off"
    monkeypatch.setenv("GEMMTUNE_MODE", "fast")
    with pytest.raises(ValueError, match="GEMMTUNE_MODE"):
        resolve_mode(None)


def test_off_is_torch_matmul_and_wrong_calls_raise():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    torch.testing.assert_close(tuned_gemm(a, b, mode="off"), a @ b)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        tuned_gemm(a, b.t(), mode="tune")


@pytest.mark.parametrize("mode", ["tune", "cache-only", "heuristic"])
def test_tensors_off_the_gpu_are_multiplied_by_torch_where_they_are(mode):
    import gemmtune

    a, b = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 4, dtype=torch.bfloat16)
    assert torch.equal(tuned_gemm(a, b, mode=mode), a @ b)
    wide = tuned_gemm(a, b, mode=mode, out_dtype=torch.float32)
    assert wide.dtype == torch.float32 and wide.device.type == "cpu"
    torch.testing.assert_close(wide, a.float() @ b.float())
    out = torch.full((8, 4), float("nan"), dtype=torch.bfloat16)
    assert tuned_gemm(a, b, mode=mode, out=out) is out and torch.equal(out, a @ b)
    batch = torch.randn(3, 8, 16), torch.randn(3, 16, 4)
    torch.testing.assert_close(tuned_gemm(*batch, mode=mode), torch.bmm(*batch))
    bias = torch.randn(4, dtype=torch.bfloat16)
    torch.testing.assert_close(tuned_gemm(a, b, mode=mode, bias=bias), torch.addmm(bias, a, b))
    plan = gemmtune.plan(a, b, mode=mode)
    assert plan.config is None and plan.reason.code == "device" and "cpu" in str(plan.reason)
    with pytest.raises(ValueError, match="a is on cpu but b is on meta"):
        tuned_gemm(a, b.to("meta"), mode=mode)


def test_plan_says_what_serves_a_call_and_why():
    import gemmtune

    a, b = torch.randn(8, 16), torch.randn(3, 16, 4)
    plan = gemmtune.plan(a, b, mode="off")
    assert plan.config is None and "off" in str(plan.reason)
    assert plan.torch_op is torch.matmul  # broadcast: torch.matmul's rules
    assert gemmtune.plan(a, b[0], mode="off").torch_op is torch.mm
    assert gemmtune.plan(b, b.transpose(1, 2), mode="off").torch_op is torch.bmm
    torch.testing.assert_close(tuned_gemm(a, b, mode="off"), a @ b)


def record_of(measured, shape):
    """A record as a tune of `shape` leaves it: `measured` (config key, ms), fastest first."""
    from gemmtune.cache.results import TunedRecord

    (best, ms), *rest = measured
    return TunedRecord(best, ms, tuple(rest), shape=shape)


def test_a_bucket_rechooses_among_its_measured_configs_for_each_shape():
    """Tuned at 4096^3, a 256x128 tile won narrowly; at 3072x3072 the same tile leaves the
    last wave 18% full (288 tiles on 132 SMs) and the model says a 128x128 tile gains more than
    the measured 1%: that is the choice. At the tuned shape itself the measurement decides."""
    from gemmtune.space.ranking import RankingModel
    from gemmtune.tuning.tuner import device_model_for

    big, small = GemmConfig(tile_m=256, tile_n=128), GemmConfig(tile_m=128, tile_n=128)
    record = record_of([(big.key, 1.00), (small.key, 1.01)], (4096, 4096, 4096, 1))
    model = RankingModel(device_model_for(problem(1, 1, 1)))
    q, t = problem(3072, 3072, 4096), problem(4096, 4096, 4096)
    # the premise: the model's ratio moves by more than the measured 1% and the margin
    ratio_big = model.predict_us(q, big) / model.predict_us(t, big)
    ratio_small = model.predict_us(q, small) / model.predict_us(t, small)
    assert ratio_big > 1.01 * SWITCH_MARGIN * ratio_small
    assert ConfigChooser.for_shape(record, q) == small
    assert ConfigChooser.for_shape(record, t) == big
    # a shape where the ratios hardly differ keeps the measured winner
    near = problem(4032, 4096, 4096)
    ratio_big = model.predict_us(near, big) / model.predict_us(t, big)
    ratio_small = model.predict_us(near, small) / model.predict_us(t, small)
    assert ratio_big < 1.01 * SWITCH_MARGIN * ratio_small
    assert ConfigChooser.for_shape(record, near) == big


def test_a_bucket_won_by_cublas_is_served_by_torch_matmul(tmp_path):
    from gemmtune.core.config import CUBLAS

    class CublasWins(FakeTuner):
        def __call__(self, p):
            result = super().__call__(p)
            result.cublas_ms = 0.1
            return result

    d = ConfigChooser(
        ResultsCache(tmp_path / "r.sqlite"), tuner=CublasWins(), environment=lambda i: H200
    )
    assert d.config_for(problem(4000, 4000, 4000), "tune") is None
    ((_, record),) = d.results.items()
    assert record.config == CUBLAS and record.runners_up[0] == (TUNED.key, 0.21)
    assert d.config_for(problem(4000, 4000, 4000), "cache-only") is None


def test_the_record_keeps_the_tuners_winner_not_a_faster_first_timing():
    """Finalists are re-timed side by side over many runs, which on a warm GPU reads slower
    than the short first timings: a non-finalist's first timing must not outrank them."""
    from gemmtune.api.choice import record_of

    fast_first = GemmConfig(tile_m=64, tile_n=64)
    results = [
        CandidateResult(TUNED, 1.0, 0.20, 1e-3, final_ms=0.22),
        CandidateResult(GemmConfig(), 2.0, 0.21, 1e-3, final_ms=0.23),
        CandidateResult(fast_first, 3.0, 0.19, 1e-3),  # not a finalist
    ]
    result = TuneResult(problem(4096, 4096, 4096), TUNED, 0.22, 1e-3, results, 100, 3, 1, 1, 3)
    record = record_of(result)
    assert record.config == TUNED.key and record.ms == 0.22
    assert record.runners_up == ((GemmConfig().key, 0.23), (fast_first.key, 0.19))
    result.cublas_ms = 0.225  # cuBLAS was timed beside the finalists: second here
    assert record_of(result).runners_up[0] == ("cublas", 0.225)
    result.cublas_ms = 0.21
    assert record_of(result).config == "cublas"


def _on_a_faked_gpu(monkeypatch, arch):
    """Tensors on the CPU described as on GPU 0 of architecture `arch`."""
    import gemmtune.core.problem as problem_module

    def on_gpu(t, name):
        return Operand(tuple(t.shape), tuple(t.stride()), t.dtype, torch.device("cuda", 0), 0)

    monkeypatch.setattr(problem_module.Operand, "of", staticmethod(on_gpu))
    monkeypatch.setattr(problem_module, "arch_of", lambda index: arch)


def test_a_gpu_without_our_kernels_falls_back_and_never_tunes(chooser, dispatcher, monkeypatch):
    """On a GPU we have no kernel for every call goes to torch.matmul; the arch is faked, the
    tensors stay on the CPU."""
    _on_a_faked_gpu(monkeypatch, Arch.OTHER)
    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    for _ in range(2):
        out = dispatcher(a, b, mode="tune")
        torch.testing.assert_close(out, a @ b)
    assert chooser.tuner.calls == 0 and chooser.results.items() == []


@pytest.mark.parametrize("mode", ["heuristic", "cache-only"])
def test_an_unverified_kernel_serves_nothing_a_tune_has_not_verified(
    chooser, dispatcher, monkeypatch, mode
):
    """The Blackwell kernel has not run on a B200: without a tuned record (the tune verifies
    every candidate on the GPU) torch.matmul serves, where on Hopper the model's first choice
    would run."""
    _on_a_faked_gpu(monkeypatch, Arch.SM100)
    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    plan = dispatcher.plan(a, b, mode=mode)
    assert plan.config is None and "sm_100" in str(plan.reason)
    torch.testing.assert_close(dispatcher(a, b, mode=mode), a @ b)
    assert chooser.tuner.calls == 0
    # a tune verifies: in mode "tune" the bucket is tuned, and its record serves
    problem = GemmProblem.from_tensors(a, b)
    assert chooser.config_for(problem, "tune") == TUNED
    assert chooser.tuner.calls == 1
    assert chooser.config_for(problem, "cache-only") == TUNED


def test_a_cached_plan_meets_a_misaligned_pointer_and_falls_back(dispatcher):
    """Plans are made for strides; a view that starts 2 bytes in keeps them, so the launch
    checks the pointers and hands such calls to torch.matmul."""
    from gemmtune.api.dispatch import Plan, plan_key

    launches = []
    buffer = torch.randn(64 * 32 + 8, dtype=torch.bfloat16)
    a = buffer[:2048].view(64, 32)
    shifted = buffer[1:2049].view(64, 32)  # same shape and strides, 2 bytes further
    b = torch.randn(32, 48, dtype=torch.bfloat16)
    plan = Plan(
        lambda *args: launches.append(args), (), TUNED, (64, 48), (48, 1), torch.bfloat16, a.device
    )
    for x in (a, shifted):
        dispatcher.plans[plan_key(x, b, None, None, None, dispatcher.signature)] = plan
    out = dispatcher(a, b)
    assert len(launches) == 1 and out.shape == (64, 48)  # our (pretend) kernel ran
    torch.testing.assert_close(dispatcher(shifted, b), shifted @ b)
    assert len(launches) == 1


def test_a_plan_storing_directly_takes_an_output_aligned_to_its_element_only(dispatcher):
    """A plan whose kernel stores directly to an output TMA cannot store (`out_alignment` of
    one element) launches for an `out` two bytes past a 16-byte boundary; a TMA-store plan
    hands the same call to torch.matmul."""
    from gemmtune.api.dispatch import Plan, plan_key

    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    out = torch.empty(64 * 48 + 8, dtype=torch.bfloat16)[1 : 1 + 64 * 48].view(64, 48)
    key = plan_key(a, b, out, None, None, dispatcher.signature)
    for alignment, launched in ((2, 1), (16, 0)):
        launches = []
        dispatcher.plans[key] = Plan(
            lambda *args, launches=launches: launches.append(args),
            (),
            TUNED,
            (64, 48),
            (48, 1),
            torch.bfloat16,
            a.device,
            out_alignment=alignment,
        )
        out.fill_(float("nan"))
        assert dispatcher(a, b, out=out) is out
        assert len(launches) == launched
        if not launched:
            torch.testing.assert_close(out, a @ b)


def test_a_call_that_wants_a_gradient_is_recorded_by_autograd(dispatcher):
    """Our kernels record no gradient: where one would serve a call whose operands require
    grad (grad mode on), the call goes through `gemmtune::mm`, whose backward gives a's and
    b's gradients; under no_grad the kernel serves it. With `out=`, torch computes it and `out`
    carries the history of the copy into it."""
    from gemmtune.api.dispatch import Plan, plan_key

    launches = []
    a = torch.randn(64, 32, requires_grad=True)
    b = torch.randn(32, 48, requires_grad=True)
    plan = Plan(
        lambda *args: launches.append(args), (), TUNED, (64, 48), (48, 1), torch.float32, a.device
    )
    dispatcher.plans[plan_key(a, b, None, None, None, dispatcher.signature)] = plan
    out = dispatcher(a, b)
    assert not launches and out.grad_fn is not None
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(a.grad, torch.ones(64, 48) @ b.detach().t())
    torch.testing.assert_close(b.grad, a.detach().t() @ torch.ones(64, 48))
    with torch.no_grad():
        dispatcher(a, b)
    assert len(launches) == 1
    target = torch.empty(64, 48)
    dispatcher.plans[plan_key(a, b, target, None, None, dispatcher.signature)] = plan
    assert dispatcher(a, b, out=target) is target and target.grad_fn is not None
    torch.testing.assert_close(target, a @ b)
    assert len(launches) == 1


def test_int_mm_off_the_gpu_is_torch_int_mm(monkeypatch):
    """Off the GPU `int_mm` is torch._int_mm, for calls it takes and calls it refuses: the same
    answer, the same error; `tuned_gemm` is never asked."""
    import gemmtune
    from gemmtune.api import dispatch

    monkeypatch.setattr(dispatch, "tuned_gemm", lambda *args, **kw: pytest.fail("tuned"))
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    b = torch.randint(-128, 128, (48, 64), dtype=torch.int8).t()
    assert torch.equal(gemmtune.int_mm(a, b), a.int() @ b.int())
    for x, y in ((a.float(), b.float()), (a[:, :60], b[:60]), (a[:8], b)):
        outcomes = []
        for function in (torch._int_mm, gemmtune.int_mm):
            try:
                outcomes.append(function(x, y))
            except RuntimeError as error:
                outcomes.append(str(error))
        theirs, ours = outcomes
        assert ours == theirs if isinstance(ours, str) else torch.equal(ours, theirs)


def test_int_mm_gives_our_kernels_only_the_cuda_calls_torch_int_mm_takes(monkeypatch):
    """On (fake) CUDA tensors `int_mm` asks `tuned_gemm` for the calls torch._int_mm serves, and
    hands torch._int_mm each call it refuses: another type, m of 16 or less, k or n not a
    multiple of 8, mismatched k, a batch, an operand off the GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import gemmtune
    from gemmtune.api import dispatch

    calls = []
    monkeypatch.setattr(dispatch, "tuned_gemm", lambda a, b, **kw: calls.append(("ours", a.shape)))
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: calls.append(("torch", a.shape)))

    def int8(*shape):
        return torch.empty(*shape, dtype=torch.int8, device="cuda")

    with FakeTensorMode():
        served = (int8(32, 64), int8(48, 64).t())
        refused = [
            (int8(32, 64).float(), int8(48, 64).t().float()),
            (int8(16, 64), int8(48, 64).t()),
            (int8(32, 60), int8(48, 60).t()),
            (int8(32, 64), int8(44, 64).t()),
            (int8(32, 64), int8(48, 72).t()),
            (int8(32, 64, 64), int8(64, 48)),
            (int8(32, 64).cpu(), int8(48, 64).t()),
            (int8(32, 64), int8(48, 64).t().cpu()),
        ]
        for a, b in [served, *refused]:
            gemmtune.int_mm(a, b)
    assert calls == [("ours", (32, 64))] + [("torch", a.shape) for a, _ in refused]


def test_another_shape_of_a_tuned_bucket_is_checked_once_on_itself(chooser, monkeypatch):
    """In mode tune a shape of the bucket other than the tuned one times the bucket's configs
    on itself; the winner is stored under the shape's own key and served from then on, in
    mode cache-only too. The tuned shape itself is never checked."""
    monkeypatch.delenv("GEMMTUNE_SHAPE_CHECK", raising=False)
    tuned, other = problem(4000, 4000, 4000), problem(3000, 2112, 4096)
    assert chooser.config_for(tuned, "tune") == TUNED
    assert chooser.config_for(tuned, "tune") == TUNED and chooser.tuner.calls == 1
    assert chooser.tuner.checks == []
    # the check times the bucket's two configs; the fake times the last given fastest
    winner = chooser.config_for(other, "tune")
    ((timed),) = chooser.tuner.checks
    assert set(timed) == {TUNED, GemmConfig()} and winner == timed[-1]
    keys = [key for key, _ in chooser.results.items()]
    assert chooser.shape_key(other) in keys and len(keys) == 2
    assert chooser.shape_key(other).startswith("shape_m3000_n2112_k4096_2d|bf16_bf16")
    shape_record = chooser.results.lookup(chooser.shape_key(other))
    bucket_record = chooser.results.lookup(chooser.bucket_key(tuned))
    assert shape_record.shape == (3000, 2112, 4096, 1)
    assert shape_record.bucket_tuned_at == bucket_record.tuned_at
    assert "bucket tuned on 4000x4000x4000x1" in shape_record.how
    # held: served without timing again, in either mode
    assert chooser.config_for(other, "tune") == winner
    assert chooser.config_for(other, "cache-only") == winner
    assert chooser.tuner.calls == 2


def test_a_check_goes_stale_when_its_bucket_is_tuned_again(chooser, monkeypatch):
    monkeypatch.delenv("GEMMTUNE_SHAPE_CHECK", raising=False)
    tuned, other = problem(4000, 4000, 4000), problem(3000, 2112, 4096)
    chooser.config_for(tuned, "tune")
    winner = chooser.config_for(other, "tune")
    assert winner != TUNED and len(chooser.tuner.checks) == 1
    retuned = dataclasses.replace(chooser.results.lookup(chooser.bucket_key(tuned)), tuned_at=2e9)
    chooser.results.store(chooser.bucket_key(tuned), retuned)
    # cache-only does not check: the record alone decides (TUNED, scaled)
    assert chooser.config_for(other, "cache-only") == ConfigChooser.for_shape(retuned, other)
    assert len(chooser.tuner.checks) == 1
    assert chooser.config_for(other, "tune") == winner and len(chooser.tuner.checks) == 2
    fresh = chooser.results.lookup(chooser.shape_key(other))
    assert fresh.bucket_tuned_at == 2e9


def test_a_check_that_cublas_wins_serves_torch_matmul(tmp_path, monkeypatch):
    from gemmtune.core.config import CUBLAS

    monkeypatch.delenv("GEMMTUNE_SHAPE_CHECK", raising=False)

    class CublasWinsChecks(FakeTuner):
        def __call__(self, p, configs=None):
            result = super().__call__(p, configs)
            if configs is not None:
                result.cublas_ms = 0.1
            return result

    chooser = ConfigChooser(
        ResultsCache(tmp_path / "r.sqlite"), tuner=CublasWinsChecks(), environment=lambda i: H200
    )
    assert chooser.config_for(problem(4000, 4000, 4000), "tune") == TUNED
    assert chooser.config_for(problem(3000, 2112, 4096), "tune") is None
    record = chooser.results.lookup(chooser.shape_key(problem(3000, 2112, 4096)))
    assert record.config == CUBLAS


def test_shape_contenders_are_the_records_best_for_the_shape_without_cublas():
    """The record's kernels ranked by their times scaled to the new shape: at 3072 x 3072 a
    256x128 tile leaves the last wave 18% full, and the 128x128 tile, measured 1% slower at
    4096^3, leads; torch.matmul is left to the check's own final."""
    from gemmtune.api.choice import SHAPE_CHECK_CONFIGS, shape_contenders
    from gemmtune.core.config import CUBLAS

    big, small = GemmConfig(tile_m=256, tile_n=128), GemmConfig(tile_m=128, tile_n=128)
    others = [GemmConfig(tile_m=128, tile_n=n) for n in (64, 96, 160)]
    measured = [(big.key, 1.00), (CUBLAS, 1.005), (small.key, 1.01)]
    measured += [(c.key, 1.5 + i) for i, c in enumerate(others)]
    record = record_of(measured, (4096, 4096, 4096, 1))
    contenders = shape_contenders(record, problem(3072, 3072, 4096))
    assert len(contenders) == SHAPE_CHECK_CONFIGS == 3
    assert contenders[:2] == [small, big] and CUBLAS not in [c.key for c in contenders]


def test_no_plan_is_made_inside_a_cuda_graph_capture(dispatcher, monkeypatch, caplog):
    """Inside a capture a call without a plan goes to torch and leaves no plan behind (a tune,
    a kernel load or a workspace cannot be captured); outside, its plan is made and kept."""
    from gemmtune.api import dispatch

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    monkeypatch.setattr(dispatch, "capturing", lambda tensor: True)
    plan = dispatcher.plan(a, b, mode="tune")
    assert plan.config is None and "capture" in str(plan.reason) and plan.torch_op is torch.mm
    torch.testing.assert_close(dispatcher(a, b, mode="tune"), a @ b)
    assert dispatcher.plans == {} and caplog.text.count("inside a CUDA graph capture") == 1
    monkeypatch.setattr(dispatch, "capturing", lambda tensor: False)
    dispatcher.plan(a, b, mode="off")
    assert len(dispatcher.plans) == 1


class RecordingKernels:
    """A kernel cache that records which signatures it is asked for and launches nothing."""

    def __init__(self):
        self.signatures = []

    def get(self, config, signature):
        self.signatures.append(signature)
        return dataclasses.make_dataclass("Kernel", ["launcher"])(launcher=lambda *args: None)


@pytest.mark.parametrize(
    ("dtype", "b_row_major", "constant_b", "loads_early"),
    [
        (torch.bfloat16, True, True, True),
        (torch.bfloat16, True, False, False),
        # 8-bit MMAs read b K-major: a row-major int8 b is copied before every launch, and the
        # copy is the kernel right before ours
        (torch.int8, True, True, False),
        (torch.int8, False, True, True),
    ],
)
def test_a_constant_b_plan_gets_the_binary_that_loads_b_early(
    dispatcher, monkeypatch, dtype, b_row_major, constant_b, loads_early
):
    _on_a_faked_gpu(monkeypatch, Arch.SM90)
    kernels = RecordingKernels()
    monkeypatch.setattr(dispatcher, "_kernels", lambda problem: kernels)
    monkeypatch.setattr("gemmtune.kernels.launch.launch_args", lambda *args, **kw: ())
    a = torch.ones(256, 512, dtype=dtype)
    b = torch.ones(512, 384, dtype=dtype) if b_row_major else torch.ones(384, 512, dtype=dtype).t()
    plan = dispatcher.plan(a, b, mode="heuristic", constant_b=constant_b)
    assert plan.config is not None
    assert [s.constant_b for s in kernels.signatures] == [loads_early]
    # the flag is part of the plan's key: the other plan is made anew
    dispatcher.plan(a, b, mode="heuristic", constant_b=not constant_b)
    assert len(kernels.signatures) == 2
