"""The tuner's selection logic on the CPU: a fake compiler, the fake benchmark runner."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from gemmtune import workers
from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand
from gemmtune.tuning.tuner import (
    CUBLAS_MARGIN,
    FINAL_MARGIN,
    FINALISTS,
    SWEEP_SWIZZLES,
    TuneResult,
    operand_placements,
    order_matters,
    tune,
)
from gemmtune.workers.compiler import CompileOutcome

sys.path.insert(0, str(Path(__file__).parents[1] / "measure"))
from fake_runner import CRASH, FAULT, HANG, WRONG, fake_ms

from gemmtune.space import candidates
from gemmtune.space.ranking import (
    FIRST_RASTER,
    FIRST_SWIZZLE,
    RankingModel,
    in_first_order,
)

RUNNER = "fake_runner:FakeRunner"
RELIABLE = "fake_runner:ReliableRunner"
COMPILE_FAILS = (64, 192)


class TroubleFirst(RankingModel):
    """Ranks one config of each tile that fails (in every way) first, then the real model's
    order."""

    def predict_us(self, problem, config):
        order = [CRASH, HANG, FAULT, WRONG, COMPILE_FAILS]
        tile = (config.tile_m, config.tile_n)
        first = (
            config.decomposition is Decomposition.DATA_PARALLEL
            and not config.swap_ab
            and (config.cluster_m, config.cluster_n, config.tma_store) == (1, 1, True)
        )
        if tile in order and first:
            return -100.0 + order.index(tile)
        return super().predict_us(problem, config)


def problem(m, n, k):
    def operand(rows, cols):
        return Operand((rows, cols), (cols, 1), torch.bfloat16, torch.device("cuda", 0), 1 << 20)

    return GemmProblem.from_operands(operand(m, k), operand(k, n), arch=Arch.SM90)


def fake_compiler(fail=()):
    compiled = []

    def compile_fn(jobs, out_dir):
        for job in jobs:
            compiled.append(job.config.compile_key)
            if (job.config.tile_m, job.config.tile_n) in fail:
                yield CompileOutcome(job, None, 0.0, "ptxas: out of registers")
            else:
                yield CompileOutcome(job, out_dir / f"{job.name}.o", 0.5)

    return compile_fn, compiled


@pytest.mark.timeout(120)
def test_tunes_top_k_then_sweeps_raster_and_swizzle_and_picks_the_fastest():
    compile_fn, compiled = fake_compiler()
    p = problem(4096, 4096, 4096)
    result = tune(p, top_k=8, compiler=compile_fn, runner=RELIABLE, progress=False)
    first = result.results[:8]
    assert len(first) == 8 and len(set(compiled)) == len(compiled)
    # the first pass runs each pick in bands, not in plain column order
    assert {(r.config.raster, r.config.swizzle) for r in first} == {(FIRST_RASTER, FIRST_SWIZZLE)}
    assert all(r.predicted_us is not None for r in first)
    # a compute-bound problem compiles no cluster variants of its leaders (see
    # test_the_leaders_other_cluster_shapes_are_compiled_and_timed for a problem that does)
    assert len(compiled) == 8
    # the best binaries swept over 2 rasters x 2 swizzles (minus the order already timed)
    leaders = {r.config.compile_key for r in sorted(first, key=lambda r: r.ms)[:2]}
    swept = result.results[len(compiled) :]
    assert len(swept) == 2 * (2 * len(SWEEP_SWIZZLES) - 1)
    assert {r.config.compile_key for r in swept} == leaders
    assert result.candidates > 10000 and result.compiled == len(compiled)
    ok = sorted(r.ms for r in result.results)
    # the leaders within the final's margin are timed again side by side (the fake adds 1%)
    finalists = [r for r in result.results if r.final_ms is not None]
    close = [ms for ms in ok if ms <= ok[0] * (1 + FINAL_MARGIN)]
    assert len(finalists) == min(FINALISTS, len(close)) > 1
    assert all(r.ms <= ok[0] * (1 + FINAL_MARGIN) for r in finalists)
    best = min(finalists, key=lambda r: r.final_ms)
    assert result.best == best.config
    assert result.best_ms == pytest.approx(fake_ms(best.config) * 1.01)
    assert result.best_tflops == pytest.approx(p.flops / (result.best_ms * 1e-3) / 1e12)
    assert result.reference_error == pytest.approx(1e-3)
    assert result.wall_s >= result.bench_s > 0


@pytest.mark.timeout(120)
def test_the_leaders_other_cluster_shapes_are_compiled_and_timed():
    # 4 x 28672 x 4096, x @ w (a gate-up projection at decode): the top k holds each narrow tile
    # in one cluster shape; the best two binaries' other shapes follow it
    compile_fn, compiled = fake_compiler()
    p = problem(4, 28672, 4096)
    result = tune(p, top_k=8, sweep=2, compiler=compile_fn, runner=RELIABLE, progress=False)
    first = result.results[:8]
    leaders = []
    for r in sorted(first, key=lambda r: r.ms):
        if r.config.compile_key not in [c.compile_key for c in leaders]:
            leaders.append(r.config)
    leaders = leaders[:2]
    clusters = [r.config for r in result.results[8 : len(compiled)]]
    assert clusters and all(c.compile_key in compiled[8:] for c in clusters)
    shapes = {leader.compile_key: set() for leader in leaders}
    for config in clusters:
        leader = next(
            c
            for c in leaders
            if dataclasses.replace(config, cluster_m=c.cluster_m, cluster_n=c.cluster_n) == c
        )
        shapes[leader.compile_key].add((config.cluster_m, config.cluster_n))
    # every shape the space offers the leading tile and the model predicts within the final's
    # margin of it, but the one it was timed in
    model = RankingModel()
    best = leaders[0]
    limit = model.predict_us(p, best) * (1 + FINAL_MARGIN)
    offered = {
        (c.cluster_m, c.cluster_n)
        for c in map(in_first_order, candidates(p, orders=False))
        if dataclasses.replace(c, cluster_m=1, cluster_n=1)
        == dataclasses.replace(best, cluster_m=1, cluster_n=1)
        and model.predict_us(p, c) <= limit
    }
    assert shapes[best.compile_key] == offered - {(best.cluster_m, best.cluster_n)}
    assert shapes[best.compile_key]


@pytest.mark.timeout(120)
def test_a_blackwell_tune_sweeps_the_cluster_shapes_of_1cta_leaders():
    def operand(rows, cols):
        return Operand((rows, cols), (cols, 1), torch.bfloat16, torch.device("cuda", 0), 1 << 20)

    class OneCtaFirst(RankingModel):
        def predict_us(self, problem, config):
            return super().predict_us(problem, config) * (10 if config.two_cta else 1)

    # the leaders are 1-CTA tiles; the space they are matched against holds 2-CTA ones, which
    # have no twin in a cluster of one (64 x 8192 x 8192: memory-bound, so swept)
    p = GemmProblem.from_operands(operand(64, 8192), operand(8192, 8192), arch=Arch.SM100)
    compile_fn, compiled = fake_compiler()
    result = tune(
        p, top_k=8, compiler=compile_fn, runner=RELIABLE, model=OneCtaFirst(), progress=False
    )
    assert len(set(compiled)) == len(compiled) > 8
    assert not any(r.config.two_cta for r in result.results)
    assert result.best is not None


@pytest.mark.timeout(120)
def test_a_compute_bound_tune_sweeps_cluster_shapes_only_for_one_wave_leaders():
    # 4096^3: the MMA work bounds it and every leader runs waves of tiles; the sweep's round of
    # compiles cost 2.3-3 s a tune there and found nothing
    model = RankingModel()
    p = problem(4096, 4096, 4096)
    assert not model.memory_bound(p) and model.memory_bound(problem(4, 28672, 4096))
    compile_fn, compiled = fake_compiler()
    tune(p, top_k=8, compiler=compile_fn, runner=RELIABLE, progress=False)
    assert len(compiled) == 8
    # 512 x 512 x 32768 is compute-bound too, but its split-K leaders are one wave
    small = problem(512, 512, 32768)
    assert not model.memory_bound(small)
    compile_fn, compiled = fake_compiler()
    tune(small, top_k=8, compiler=compile_fn, runner=RELIABLE, progress=False)
    assert len(compiled) > 8


@pytest.mark.timeout(120)
def test_configs_given_are_timed_as_given():
    compile_fn, compiled = fake_compiler()
    configs = [GemmConfig(tile_m=128, tile_n=128), GemmConfig(tile_m=128, tile_n=256)]
    result = tune(
        problem(4096, 4096, 4096), configs=configs, sweep=0, compiler=compile_fn,
        runner=RELIABLE, progress=False,
    )  # fmt: skip
    assert sorted(compiled) == sorted(c.compile_key for c in configs)
    assert [r.config for r in result.results] == configs


@pytest.mark.timeout(120)
def test_configs_given_that_cannot_serve_the_problem_are_refused_not_run():
    """N = 2100 bf16: rows of 4200 bytes, which TMA cannot store. A TMA-store config named by
    hand fails with the rule's reason and is never compiled; its thread-store twin runs."""
    compile_fn, compiled = fake_compiler()
    tma = GemmConfig(tile_m=128, tile_n=128)
    threads = dataclasses.replace(tma, tma_store=False)
    result = tune(
        problem(2050, 2100, 2000), configs=[tma, threads], sweep=0, compiler=compile_fn,
        runner=RELIABLE, progress=False,
    )  # fmt: skip
    assert compiled == [threads.compile_key]
    refused = [r for r in result.results if r.config == tma]
    assert len(refused) == 1 and not refused[0].ok
    assert "TMA cannot store" in refused[0].error
    assert result.best == threads


@pytest.mark.timeout(120)
def test_order_is_swept_in_one_round_too_but_not_for_a_single_unit():
    compile_fn, _ = fake_compiler()
    # 2048 x 1024 x 8192: 128 tiles of 128x128, one round of 132 SMs, whose order still
    # decides which clusters are neighbours
    p = problem(2048, 1024, 8192)
    result = tune(p, top_k=4, compiler=compile_fn, runner=RELIABLE, progress=False)
    orders = {(r.config.raster, r.config.swizzle) for r in result.results}
    assert len(orders) == 2 * len(SWEEP_SWIZZLES)
    assert order_matters(GemmConfig(), p)
    assert not order_matters(GemmConfig(tile_m=128, tile_n=128), problem(100, 128, 4096))


@pytest.mark.timeout(120)
def test_failures_are_recorded_and_never_chosen():
    compile_fn, _ = fake_compiler(fail={COMPILE_FAILS})
    result = tune(
        problem(4096, 4096, 4096),
        top_k=5 + 4,
        sweep=1,
        compiler=compile_fn,
        runner=RUNNER,
        model=TroubleFirst(),
        run_timeout_s=5,
        progress=False,
    )
    errors = {}
    for r in result.failures:
        assert r.ms is None and r.error
        errors.setdefault((r.config.tile_m, r.config.tile_n), r.error)
    assert "died" in errors[CRASH] and "hung" in errors[HANG]
    assert "illegal memory access" in errors[FAULT] and "wrong result" in errors[WRONG]
    assert "compile: ptxas" in errors[COMPILE_FAILS]
    assert len(result.failures) == 5  # one config of each troubled tile
    assert result.best is not None and result.best not in [r.config for r in result.failures]
    finalists = [r for r in result.results if r.final_ms is not None]
    assert result.best_ms == min(r.final_ms for r in finalists)


@pytest.mark.timeout(120)
def test_a_tune_whose_every_compile_fails_chooses_nothing_and_sweeps_nothing():
    def compile_fn(jobs, out_dir):
        for job in jobs:
            yield CompileOutcome(job, None, 0.0, "ptxas: out of registers")

    result = tune(
        problem(4, 28672, 4096), top_k=4, compiler=compile_fn, runner=RELIABLE, progress=False
    )
    assert result.best is None and result.best_ms is None
    assert len(result.results) == 4 and all("compile: ptxas" in r.error for r in result.failures)


@pytest.mark.timeout(120)
def test_exhaustive_times_every_binary_and_split_count():
    compile_fn, compiled = fake_compiler()
    result = tune(
        problem(512, 512, 32768),
        exhaustive=True,
        sweep=0,
        compiler=compile_fn,
        runner=RELIABLE,
        progress=False,
    )
    split_k = [r for r in result.results if r.config.decomposition is Decomposition.SPLIT_K]
    assert {r.config.splits for r in split_k} == {2, 3, 4, 6, 8, 12, 16}
    # 1086 data-parallel and 888 stream-K binaries, 1008 split-K ones at 7 split counts each
    # (the narrow tiles at both stage widths), each also swapped (but 12 whose thread stores
    # would spill into the swapped, M-major output)
    assert len(compiled) == 2982 * 2 - 12
    assert len(result.results) == (1086 + 888 + 1008 * 7) * 2 - 12


def test_unsupported_problems_are_refused():
    p = GemmProblem.from_operands(
        Operand((64, 64), (64, 1), torch.float32, torch.device("cuda", 0), 1 << 20),
        Operand((64, 64), (64, 1), torch.float32, torch.device("cuda", 0), 1 << 20),
        arch=Arch.SM90,
    )
    with pytest.raises(ValueError, match="no gemmtune kernel serves"):
        tune(p, runner=RUNNER, progress=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cublas_ms, winner", [(1e-6, "cublas"), (1e6, "gemmtune")])
def test_cublas_runs_beside_the_finalists_and_can_win(monkeypatch, cublas_ms, winner):
    monkeypatch.setenv("FAKE_CUBLAS_MS", str(cublas_ms))
    workers.shutdown()  # the next worker inherits it
    compile_fn, _ = fake_compiler()
    result = tune(
        problem(4096, 4096, 4096), compiler=compile_fn, runner=RELIABLE, progress=False, cublas=True
    )
    assert result.cublas_ms == pytest.approx(cublas_ms) and result.backend == winner
    assert result.best is not None  # our best kernel is still reported


@pytest.mark.timeout(120)
def test_a_close_call_against_cublas_is_timed_again_before_it_is_made():
    """The final puts our best 2 % ahead of torch.matmul, inside `CONFIRM_MARGIN`: the two are
    timed again side by side, torch.matmul 3 % ahead there, and that ratio decides: torch.matmul
    serves the bucket."""
    from gemmtune.tuning.tuner import CONFIRM_MARGIN

    assert CONFIRM_MARGIN > 0.02 and CUBLAS_MARGIN < 0.02
    compile_fn, _ = fake_compiler()
    result = tune(
        problem(4096, 4096, 4096),
        compiler=compile_fn,
        runner="fake_runner:CloseCublasRunner",
        progress=False,
        cublas=True,
    )
    best = min((r for r in result.results if r.final_ms is not None), key=lambda r: r.final_ms)
    first = best.final_ms  # both of its times are the same in the fake
    assert result.cublas_ms == pytest.approx(first * 0.97)
    assert result.backend == "cublas"


@pytest.mark.parametrize(
    "best_ms, cublas_ms, backend",
    [
        (0.98, 1.0, "gemmtune"),  # 2 % ahead
        (0.995, 1.0, "cublas"),  # ahead, but by less than the margin
        (1.02, 1.0, "cublas"),
        (None, 1.0, "cublas"),  # nothing of ours ran correctly
        (1.02, None, "gemmtune"),  # torch.matmul was not in the final
    ],
)
def test_a_kernel_replaces_cublas_only_by_a_margin(best_ms, cublas_ms, backend):
    result = TuneResult(
        problem(4096, 4096, 4096),
        GemmConfig(),
        best_ms,
        None,
        [],
        candidates=1,
        compiled=1,
        compile_s=0.0,
        bench_s=0.0,
        wall_s=0.0,
        cublas_ms=cublas_ms,
    )
    assert 1 - 0.995 < CUBLAS_MARGIN < 1 - 0.98
    assert result.backend == backend


def test_the_final_takes_each_binarys_fastest_order_before_any_second_order():
    from gemmtune.tuning.tuner import CandidateResult, finalists_of

    def result(key, ms):
        return CandidateResult(GemmConfig.from_key(key), None, ms)

    tile = "sm90_128x16_c1x1_swap_pp_tma_k256_dp"
    results = [
        result(f"{tile}_rn_s1", 0.2143),
        result(f"{tile}_rn_s8", 0.2146),
        result(f"{tile}_rm_s8", 0.2147),
        result("sm90_128x16_c1x2_swap_pp_tma_k256_dp_rn_s1", 0.2148),
        result("sm90_128x32_c1x1_swap_pp_tma_k256_dp_rm_s8", 0.2175),
        CandidateResult(
            GemmConfig.from_key("sm90_64x16_c1x1_swap_pp_tma_k256_dp_rm_s8"), None, None
        ),
        result("sm90_64x256_c1x1_pp_tma_dp_rm_s8", 0.2500),  # beyond the margin
    ]
    keys = [r.config.key for r in finalists_of(results, 4, 0.10)]
    assert keys == [
        f"{tile}_rn_s1",
        "sm90_128x16_c1x2_swap_pp_tma_k256_dp_rn_s1",
        "sm90_128x32_c1x1_swap_pp_tma_k256_dp_rm_s8",
        f"{tile}_rn_s8",
    ]
    # with more places than binaries, the other orders follow, fastest first; never one
    # beyond the margin or one that failed
    keys = [r.config.key for r in finalists_of(results, 10, 0.10)]
    assert keys[3:] == [f"{tile}_rn_s8", f"{tile}_rm_s8"]
    assert finalists_of([], 4, 0.10) == []


def test_a_binary_the_ranking_doubts_enters_the_final_beyond_its_places():
    from gemmtune.tuning.tuner import CandidateResult, finalists_of

    def result(key, ms):
        return CandidateResult(GemmConfig.from_key(key), None, ms)

    # fp8 4096^3 per row: the first pass put the 128x128 ping-pong tile the ranking adds
    # sixth; in windows it was the fastest
    results = [
        result("sm90_128x176_c1x2_pp_tma_dp_rn_s1", 0.1039),
        result("sm90_128x256_c1x1_coop_tma_dp_rm_s8", 0.1048),
        result("sm90_128x208_c1x1_coop_tma_dp_rm_s8", 0.1103),
        result("sm90_128x192_c4x1_pp_tma_dp_rm_s8", 0.1109),
        result("sm90_256x176_c2x1_coop_tma_dp_rm_s8", 0.1121),
        result("sm90_128x128_c2x1_pp_tma_dp_rn_s1", 0.1134),
        result("sm90_128x128_c2x1_pp_tma_dp_rm_s1", 0.1144),
        result("sm90_64x256_c1x1_pp_tma_dp_rm_s1", 0.1300),  # beyond the margin
    ]
    doubted = {"sm90_128x128_c2x1_pp_tma_dp", "sm90_64x256_c1x1_pp_tma_dp"}
    keys = [r.config.key for r in finalists_of(results, 4, 0.10, doubted)]
    assert keys == [r.config.key for r in results[:4]] + ["sm90_128x128_c2x1_pp_tma_dp_rn_s1"]
    # one already among the four takes no second place
    keys = [r.config.key for r in finalists_of(results[5:], 4, 0.10, doubted)]
    assert keys == ["sm90_128x128_c2x1_pp_tma_dp_rn_s1", "sm90_128x128_c2x1_pp_tma_dp_rm_s1"]


def test_memory_bound_problems_are_timed_on_several_placements_of_their_operands():
    model = RankingModel()
    decode = problem(16, 8192, 8192)  # a 134 MB weight read for 4 MFLOP per row
    assert model.memory_bound(decode)
    assert operand_placements(decode, model) == 4
    huge_weight = problem(16, 57344, 28672)  # 3.3 GB: a copy would not fit the budget
    assert model.memory_bound(huge_weight)
    assert operand_placements(huge_weight, model) == 1
    square = problem(4096, 4096, 4096)
    assert not model.memory_bound(square)
    assert operand_placements(square, model) == 1
