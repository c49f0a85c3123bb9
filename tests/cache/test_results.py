import multiprocessing
import sqlite3

import pytest
import torch

from gemmtune.cache.buckets import BucketPolicy, Environment, bucket_key
from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand

H200 = Environment("NVIDIA H200", 132, "0.1.0", "4.8.1")
H100 = Environment("NVIDIA H100 80GB HBM3", 132, "0.1.0", "4.8.1")


def problem(m, n, k, l=1, dtype=torch.bfloat16, b_major_k=False):
    lead = (l,) if l > 1 else ()

    def operand(rows, cols, column_major=False):
        shape = (*lead, rows, cols)
        stride = (rows * cols,) * len(lead) + ((1, rows) if column_major else (cols, 1))
        return Operand(shape, stride, dtype, torch.device("cuda", 0), 1 << 20)

    return GemmProblem.from_operands(operand(m, k), operand(k, n, b_major_k), arch=Arch.SM90)


def record(config="sm90_128x256_c2x1_coop_tma_dp_rm_s1", ms=0.2):
    runner_up = (("sm90_128x128_c1x1_coop_tma_dp_rm_s1", 0.25),)
    return TunedRecord(config, ms, runner_up, tuned_at=1.8e9, shape=(1, 2, 3, 1))


@pytest.mark.parametrize(
    ("policy", "sizes", "expected"),
    [
        (BucketPolicy("pow2"), [1, 2, 3, 1000, 1024, 1025], [1, 2, 4, 1024, 1024, 2048]),
        (BucketPolicy("exact"), [1, 3, 1000], [1, 3, 1000]),
        (BucketPolicy.parse("128,512,4096"), [1, 100, 129, 4096, 5000], [1, 128, 512, 4096, 8192]),
    ],
)
def test_bucket_rounding(policy, sizes, expected):
    assert [policy.round(s) for s in sizes] == expected


@pytest.mark.parametrize("text", ["linear", "5,3", ""])
def test_bad_bucket_policies(text):
    with pytest.raises(ValueError):
        BucketPolicy.parse(text)


def test_bucket_keys_share_a_bucket_and_separate_what_matters():
    pow2 = BucketPolicy()
    key = bucket_key(problem(1000, 1000, 1000), H200, pow2)
    assert (
        key
        == "m1024_n1024_k1024_2d|bf16_bf16_ak_bn_on_2d|NVIDIA H200|132sm|gemmtune 0.1.0|dsl 4.8.1"
    )
    assert bucket_key(problem(1024, 600, 513), H200, pow2) == key
    others = {
        bucket_key(problem(1000, 1000, 1025), H200, pow2),  # k in the next bucket
        bucket_key(problem(1000, 1000, 1000, dtype=torch.float16), H200, pow2),
        bucket_key(problem(1000, 1000, 1000, b_major_k=True), H200, pow2),  # layout
        bucket_key(problem(1000, 1000, 1000, l=2), H200, pow2),  # batched
        bucket_key(problem(1000, 1000, 1000), H100, pow2),  # another GPU
        bucket_key(
            problem(1000, 1000, 1000), Environment("NVIDIA H200", 132, "0.2.0", "4.8.1"), pow2
        ),
        bucket_key(problem(1000, 1000, 1000), H200, BucketPolicy("exact")),
    }
    assert key not in others and len(others) == 7


def test_an_8bit_bucket_whose_operand_is_copied_is_not_the_k_major_ones():
    pow2 = BucketPolicy()
    k_major = bucket_key(problem(1000, 1000, 1000, dtype=torch.int8, b_major_k=True), H200, pow2)
    copied = bucket_key(problem(1000, 1000, 1000, dtype=torch.int8), H200, pow2)
    # the same binaries serve both, but the copy is in one bucket's times and torch's
    # contender differs: the records must not mix
    assert copied == k_major.replace("_on_2d|", "_on_2d_copy_b|")
    assert copied != k_major


def test_store_lookup_and_the_memory_in_front(tmp_path):
    cache = ResultsCache(tmp_path / "r.sqlite")
    assert cache.lookup("k") is None
    cache.store("k", record())
    assert cache.lookup("k") == record()
    # a second cache on the same file (another process) sees it from disk
    other = ResultsCache(tmp_path / "r.sqlite")
    assert other.memory == {} and other.lookup("k") == record()
    assert other.lookup("k").gemm_config == GemmConfig(tile_m=128, tile_n=256, cluster_m=2)


def test_results_of_another_gpu_or_version_are_not_found(tmp_path):
    cache = ResultsCache(tmp_path / "r.sqlite")
    p = problem(4096, 4096, 4096)
    cache.store(bucket_key(p, H100, BucketPolicy()), record())
    assert cache.lookup(bucket_key(p, H200, BucketPolicy())) is None
    newer = Environment("NVIDIA H100 80GB HBM3", 132, "0.2.0", "4.8.1")
    assert cache.lookup(bucket_key(p, newer, BucketPolicy())) is None


def test_corrupt_database_is_set_aside_and_rebuilt(tmp_path, caplog):
    path = tmp_path / "r.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    cache = ResultsCache(path)
    assert cache.lookup("k") is None
    cache.store("k", record())
    assert ResultsCache(path).lookup("k") == record()
    assert any(p.name.startswith("r.sqlite.corrupt-") for p in tmp_path.iterdir())
    assert "unreadable" in caplog.text


def test_export_import_round_trip(tmp_path):
    source = ResultsCache(tmp_path / "a.sqlite")
    for i in range(5):
        source.store(f"key{i}", record(ms=i + 0.5))
    assert source.export(tmp_path / "table.json") == 5
    target = ResultsCache(tmp_path / "b.sqlite")
    assert target.import_(tmp_path / "table.json") == 5
    assert target.items() == source.items()
    (tmp_path / "bad.json").write_text('{"something": 1}')
    with pytest.raises(ValueError, match="not a gemmtune results export"):
        target.import_(tmp_path / "bad.json")
    assert target.clear() == 5 and target.items() == [] and target.lookup("key1") is None


def _writer(path, worker, count):
    cache = ResultsCache(path)
    for i in range(count):
        cache.store(f"w{worker}-{i}", record(ms=worker + i / 1000))
        cache.store("shared", record(ms=float(worker)))


@pytest.mark.timeout(300)
def test_eight_processes_writing_at_once_lose_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultsCache(path).clear()
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_writer, args=(path, w, 60)) for w in range(8)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(timeout=240)
        assert p.exitcode == 0
    items = dict(ResultsCache(path).items())
    assert len(items) == 8 * 60 + 1
    assert all(items[f"w{w}-{i}"].ms == w + i / 1000 for w in range(8) for i in range(60))
    assert items["shared"].ms in {float(w) for w in range(8)}
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
