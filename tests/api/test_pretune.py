"""Pretuning: the GEMMs a model or a config names, the split of buckets between ranks, and two
gloo ranks that tune their shares and end with identical tables (CPU, a fake tuner)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gemmtune.api.choice import ConfigChooser
from gemmtune.api.pretune import (
    GemmShape,
    GpuThreads,
    LinearShape,
    claimed,
    linear_gemms,
    linear_shapes,
    pretune_problems,
    shapes_from_config,
    share_out,
)
from gemmtune.api.torch_ops import use_tuned_linear
from gemmtune.cache.buckets import Environment
from gemmtune.cache.results import ResultsCache
from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem
from gemmtune.tuning.tuner import CandidateResult, TuneResult

CHILD = Path(__file__).with_name("pretune_child.py")
LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}


def test_a_llama_config_names_its_four_projections():
    shapes = shapes_from_config(LLAMA3_8B)
    assert [(s.name, s.n, s.k) for s in shapes] == [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ]
    assert not any(s.bias for s in shapes)
    listed = shapes_from_config({"dtype": "fp16", "linears": [{"name": "w", "n": 8, "k": 16}]})
    assert listed == [LinearShape("w", 8, 16, torch.float16)]
    biased = shapes_from_config({"linears": [{"n": 8, "k": 16, "bias": True}]})
    assert biased == [LinearShape("linear0", 8, 16, torch.bfloat16, bias=True)]
    qwen_like = shapes_from_config({**LLAMA3_8B, "attention_bias": True})
    assert [s.bias for s in qwen_like] == [True, True, False, False]
    with pytest.raises(ValueError, match="hidden_size"):
        shapes_from_config({"intermediate_size": 4})


def test_a_models_linear_layers_are_found_from_their_weights_once_each():
    model = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.Linear(64, 128),
        nn.Linear(64, 128, bias=False),
    )  # fmt: skip
    model[2] = nn.Sequential(model[2])  # nested
    use_tuned_linear(model[2])  # a TunedLinear counts too
    shapes = linear_shapes(model)
    f32 = torch.float32
    assert [(s.n, s.k, s.dtype, s.bias) for s in shapes] == [
        (128, 64, f32, True), (64, 128, f32, True), (128, 64, f32, False)
    ]  # fmt: skip
    gemms = linear_gemms(shapes, [1, 32])
    assert gemms[:2] == [
        GemmShape(1, 128, 64, dtype=f32, bias=True), GemmShape(32, 128, 64, dtype=f32, bias=True)
    ]  # fmt: skip
    assert all(g.layout == "tt" for g in gemms)  # x @ w.t(): b K-major


@pytest.mark.parametrize(("arch", "fused"), [(Arch.SM90, True), (Arch.SM100, False)])
def test_a_biased_layers_problem_is_the_one_tuned_gemm_meets(monkeypatch, arch, fused):
    """Where the kernel adds the bias the biased problem (a bucket of its own), else the
    product the bias is added to."""
    import gemmtune.core.problem as problem_module

    monkeypatch.setattr(problem_module, "arch_of", lambda index: arch)
    gemm = GemmShape(16, 4096, 4096, bias=True)
    p = gemm.problem(torch.device("cuda", 0))
    assert p.supported and p.bias is fused
    assert not GemmShape(16, 4096, 4096).problem(torch.device("cuda", 0)).bias


def test_held_keys_go_to_their_lowest_holder_and_the_rest_queue_longest_first():
    keys = ["a", "b", "c", "d", "e"]
    work = {"a": 1, "b": 5, "c": 9, "d": 5, "e": 2}
    shares = share_out([keys, keys, keys], [set(), {"c", "a"}, {"a"}], work.get)
    assert shares.held == {"a": 1, "c": 1}  # nobody tunes them
    assert shares.queues == {(0, 1, 2): ["b", "d", "e"]}  # ties keep the listing order
    # keys only some ranks list (another GPU model) queue for those ranks alone
    shares = share_out([["x", "z"], ["y", "z"]], [set(), set()])
    assert shares.queues == {(0,): ["x"], (0, 1): ["z"], (1,): ["y"]}


def test_ranks_drawing_from_one_counter_claim_each_key_once():
    import torch.distributed as dist

    store = dist.HashStore()
    keys = [f"k{i}" for i in range(7)]
    ranks = [claimed(store, "queue", keys) for _ in range(3)]
    taken: list[list[str]] = [[], [], []]
    for turn in [0, 1, 1, 2, 0, 0, 2, 1, 0, 1, 2]:  # ranks that finish tunes at their own pace
        key = next(ranks[turn], None)
        if key is not None:
            taken[turn].append(key)
    assert taken == [["k0", "k4", "k5"], ["k1", "k2"], ["k3", "k6"]]
    assert all(next(r, None) is None for r in ranks)  # the queue is empty for everyone
    assert next(claimed(store, "another queue", keys)) == "k0"


class CountingTuner:
    def __init__(self):
        self.tuned = []
        self.options = []

    def __call__(self, problem, **options):
        self.tuned.append(problem.m)
        self.options.append(options)
        config = GemmConfig()
        return TuneResult(
            problem, config, 0.1, 1e-3, [CandidateResult(config, None, 0.1)], 1, 1, 0.0, 0.0, 0.1
        )


def test_one_process_tunes_what_the_cache_lacks_and_resumes(tmp_path):
    tuner = CountingTuner()
    chooser = ConfigChooser(
        results=ResultsCache(tmp_path / "r.sqlite"),
        tuner=tuner,
        environment=lambda index: Environment("NVIDIA H200", 132, "0", "0"),
    )
    problems = [
        GemmProblem.of_shape(m, 4096, 4096, layout="tt", arch=Arch.SM90) for m in (1, 2, 3, 16)
    ]
    problems.append(GemmProblem.of_shape(8, 4096, 4096, dtype=torch.float32, arch=Arch.SM90))
    chooser.ensure_tuned(problems[1])  # tuned before: kept
    first = pretune_problems(problems, chooser=chooser, progress=False)
    # 3 rounds up to 4, 2's bucket was held; float32 is not ours to tune
    assert tuner.tuned == [2, 1, 3, 16]
    # the pretune's bar counts buckets: its tunes draw none of their own
    assert [o.get("progress") for o in tuner.options[1:]] == [False, False, False]
    assert [row.source for row in first.rows] == ["tuned", "cached", "tuned", "tuned"]
    assert first.tuned == 3 and all(row.config for row in first.rows)
    again = pretune_problems(problems, chooser=chooser, progress=False)
    assert tuner.tuned == [2, 1, 3, 16] and again.tuned == 0  # resumed: nothing left
    exported = tmp_path / "table.json"
    assert first.export(exported) == 4
    other = ResultsCache(tmp_path / "other.sqlite")
    assert other.import_(exported) == 4
    assert {k: r.to_json() for k, r in other.items()} == {
        k: r.to_json() for k, r in chooser.results_cache().items()
    }


def test_threads_of_two_gpus_take_each_bucket_once_longest_first(tmp_path):
    import threading
    import time

    tuned: list[tuple[int, int]] = []

    def tuner(problem, **options):
        tuned.append((problem.device.index, problem.m))
        time.sleep(0.05)  # a tune takes a while: both threads get buckets
        config = GemmConfig(tile_n=64 + 8 * problem.device.index)
        return TuneResult(
            problem, config, 0.1, 1e-3, [CandidateResult(config, None, 0.1)], 1, 1, 0.0, 0.0, 0.1
        )

    chooser = ConfigChooser(
        results=ResultsCache(tmp_path / "r.sqlite"),
        tuner=tuner,
        environment=lambda index: Environment("NVIDIA H200", 132, "0", "0"),
    )
    sizes = (1, 2, 4, 3, 64, 256, 1024)  # 3 shares the bucket of 4
    threads = GpuThreads(2)
    outcomes = [None, None]

    def run(gpu: int) -> None:
        problems = [
            GemmProblem.of_shape(m, 4096, 4096, layout="tt", device=f"cuda:{gpu}", arch=Arch.SM90)
            for m in sizes
        ]
        outcomes[gpu] = pretune_problems(problems, chooser=chooser, progress=False, threads=threads)

    workers = [threading.Thread(target=run, args=(gpu,)) for gpu in (0, 1)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    buckets = [m for _, m in tuned]
    assert sorted(buckets) == [1, 2, 4, 64, 256, 1024]  # each bucket tuned once
    assert buckets[:2] == [1024, 256] or buckets[:2] == [256, 1024]  # longest first
    assert {gpu for gpu, _ in tuned} == {0, 1}
    for outcome in outcomes:
        assert all(row.config for row in outcome.rows) and outcome.tuned == 6
        for row in outcome.rows:
            # a row says which GPU's thread tuned it, and its record is that thread's
            tuner_gpu = int(row.source.removeprefix("tuned on gpu "))
            assert GemmConfig.from_key(row.config).tile_n == 64 + 8 * tuner_gpu


def test_a_failed_thread_releases_the_others_from_the_end_of_a_round():
    import threading

    threads = GpuThreads(2)
    caught = []

    def wait() -> None:
        try:
            threads.meet()
        except threading.BrokenBarrierError as exc:
            caught.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    threads.abort()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and len(caught) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hold", [False, True])
def test_two_gloo_ranks_split_the_buckets_and_store_identical_tables(tmp_path, hold):
    init_file = tmp_path / "group"
    processes = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(rank), "2", str(init_file), str(tmp_path)]
            + (["hold"] if hold and rank == 1 else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    reports = []
    for p in processes:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    tuned = [set(r["tuned"]) for r in reports]
    buckets = 10 - hold  # 2 layers x 5 batch sizes, one held by rank 1
    assert not tuned[0] & tuned[1]
    assert len(tuned[0] | tuned[1]) == buckets
    assert tuned[0] and tuned[1]  # both ranks claimed work while it lasted
    # every rank ends with the same records, each from the rank that provided it
    assert reports[0]["records"] == reports[1]["records"] and len(reports[0]["records"]) == 10
    for record in map(json.loads, reports[0]["records"].values()):
        assert record["config"] in {GemmConfig(tile_n=t).key for t in (64, 72, 208)}
    if hold:
        records = reports[0]["records"]
        held = [k for k, r in records.items() if json.loads(r)["how"] == "held before"]
        assert len(held) == 1 and reports[0]["sources"][held[0]] == "rank 1"
        assert reports[1]["sources"][held[0]] == "cached"


def test_a_bucket_whose_tune_fails_leaves_the_others_tuned(tmp_path, caplog):
    tuner = CountingTuner()

    def flaky(problem, **options):
        if problem.m == 16:
            raise RuntimeError("the benchmark worker died")
        return tuner(problem)

    chooser = ConfigChooser(
        results=ResultsCache(tmp_path / "r.sqlite"),
        tuner=flaky,
        environment=lambda index: Environment("NVIDIA H200", 132, "0", "0"),
    )
    problems = [GemmProblem.of_shape(m, 4096, 4096, arch=Arch.SM90) for m in (1, 16, 64)]
    outcome = pretune_problems(problems, chooser=chooser, progress=False)
    assert tuner.tuned == [1, 64]
    assert [row.config is not None for row in outcome.rows] == [True, False, True]
    assert "the benchmark worker died" in caplog.text


def test_shapes_of_a_bucket_tuned_on_another_are_checked_after_the_buckets(tmp_path, monkeypatch):
    """Two layers whose GEMMs share a bucket: the first listed is tuned, the other checked on
    its own shape (the bucket's configs timed there) and listed as such; a rerun does
    neither again."""
    monkeypatch.delenv("GEMMTUNE_SHAPE_CHECK", raising=False)
    calls = []

    def tuner(problem, configs=None, **options):
        calls.append((problem.n, None if configs is None else len(configs)))
        timed = configs or [GemmConfig(), GemmConfig(tile_n=64)]
        results = [CandidateResult(c, None, 0.1 + 0.01 * i) for i, c in enumerate(timed)]
        return TuneResult(problem, timed[0], 0.1, 1e-3, results, 2, 2, 0.0, 0.0, 0.1)

    chooser = ConfigChooser(
        results=ResultsCache(tmp_path / "r.sqlite"),
        tuner=tuner,
        environment=lambda index: Environment("NVIDIA H200", 132, "0", "0"),
    )
    gemms = linear_gemms([LinearShape("qkv", 6144, 4096), LinearShape("up", 8192, 4096)], [64])
    problems = [GemmProblem.of_shape(g.m, g.n, g.k, arch=Arch.SM90) for g in gemms]
    outcome = pretune_problems(problems, chooser=chooser, progress=False)
    assert calls == [(6144, None), (8192, 2)]
    assert [(row.shape[1], row.source) for row in outcome.rows] == [
        (6144, "tuned"),
        (8192, "checked"),
    ]
    assert outcome.rows[1].key == chooser.shape_key(problems[1])
    again = pretune_problems(problems, chooser=chooser, progress=False)
    assert len(calls) == 2 and [row.source for row in again.rows] == ["cached", "cached"]
    monkeypatch.setenv("GEMMTUNE_SHAPE_CHECK", "0")  # no checks: the buckets alone are listed
    unchecked = pretune_problems(problems, chooser=chooser, progress=False)
    assert [row.source for row in unchecked.rows] == ["cached"]
