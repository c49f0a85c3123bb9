import importlib.util
import json
from pathlib import Path

import pytest
import torch

from gemmtune.api import dispatch as api
from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.cli.bench import load_shape_suite, plan_config
from gemmtune.cli.main import build_parser, main, parse_shape
from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem
from gemmtune.tuning.tuner import CandidateResult, TuneResult

KEY = "m4096_n4096_k4096_2d|bf16_bf16_ak_bn_on_2d|NVIDIA H200|132sm|gemmtune 0.1.0|dsl 4.8.1"
CONFIG = "sm90_128x256_c2x1_coop_tma_dp_rm_s1"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def fill(key: str = KEY, config: str = CONFIG, ms: float | None = 0.1234) -> TunedRecord:
    record = TunedRecord(config, ms, tuned_at=1.7e9, how="tuned", shape=(4000, 4096, 4096, 1))
    ResultsCache().store(key, record)
    return record


# -- help -----------------------------------------------------------------------------------------

HELP = {
    (): ["doctor", "tune", "show", "clear", "bench", "cache"],
    ("doctor",): ["--json", "--compile"],
    ("tune",): [
        "--shape",
        "MxNxK",
        "--dtype",
        "--out-dtype",
        "--layout",
        "--out-major",
        "--top-k",
        "--exhaustive",
        "--configs",
        "--no-cublas",
        "--json",
    ],
    ("show",): ["--json"],
    ("clear",): ["--kernels"],
    ("bench",): ["--shapes", "--dtype", "--mode", "cache-only", "heuristic", "--runs", "--json"],
    ("cache",): ["show", "clear", "export", "import", "--json"],
}


@pytest.mark.parametrize("command", list(HELP), ids=lambda c: " ".join(c) or "gemmtune")
def test_help(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gemmtune {' '.join(command)}".rstrip())
    for word in HELP[command]:
        assert word in out, word


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


# -- doctor ---------------------------------------------------------------------------------------


def test_doctor_json(capsys, cache_dir):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cache_dir"] == str(cache_dir) and report["dsl"]["nvidia_cutlass_dsl"]


# -- show, clear, cache ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["show"], ["cache", "show"]])
def test_show_empty(capsys, cache_dir, command):
    assert main(command) == 0
    out = capsys.readouterr().out
    assert out.strip() == f"0 results in {cache_dir / 'results.sqlite'}"


@pytest.mark.parametrize("command", [["show"], ["cache", "show"]])
def test_show_table(capsys, cache_dir, command):
    fill()
    fill("m128_n128_k128_2d|odd key", "cublas", None)
    assert main(command) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:3] == ["bucket", "signature", "GPU"] and header[-3:] == ["winner", "ms", "tuned"]
    assert set(lines[1]) == {"-", " "}
    # sorted by key; every row's cells start where the header's do
    odd, tuned = lines[2], lines[3]
    assert odd.split()[:2] == ["m128_n128_k128_2d", "odd"] and "cublas" in odd
    cells = tuned.split("  ")
    cells = [c.strip() for c in cells if c.strip()]
    assert cells[:6] == [
        "m4096_n4096_k4096_2d",
        "bf16_bf16_ak_bn_on_2d",
        "NVIDIA H200 (132sm)",
        "4000x4096x4096",
        CONFIG,
        "0.1234",
    ]
    assert cells[6].startswith("20") and len(cells[6]) == len("2023-11-14 22:13")
    assert tuned.index(CONFIG) == lines[0].index("winner")
    assert lines[-1] == f"2 results in {cache_dir / 'results.sqlite'}"


def test_show_json(capsys, cache_dir):
    record = fill()
    assert main(["show", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["key"] == KEY and row["bucket"] == "m4096_n4096_k4096_2d"
    assert row["signature"] == "bf16_bf16_ak_bn_on_2d"
    assert row["gpu"] == "NVIDIA H200" and row["sms"] == "132sm"
    assert row["versions"] == ["gemmtune 0.1.0", "dsl 4.8.1"]
    assert row["config"] == CONFIG and row["ms"] == 0.1234
    assert row["shape"] == [4000, 4096, 4096, 1] and row["tuned_at"] == record.tuned_at


@pytest.mark.parametrize("command", [["clear"], ["cache", "clear"]])
def test_clear(capsys, cache_dir, command):
    fill()
    fill("m128_n128_k128_2d|x")
    kernels = cache_dir / "kernels" / "sm_90a"
    kernels.mkdir(parents=True)
    (kernels / "k.so").write_bytes(b"x")
    assert main(command) == 0
    assert f"cleared 2 results from {cache_dir / 'results.sqlite'}" in capsys.readouterr().out
    assert ResultsCache().items() == []
    assert (kernels / "k.so").exists()  # without --kernels the compiled kernels stay


@pytest.mark.parametrize("command", [["clear", "--kernels"], ["cache", "clear", "--kernels"]])
def test_clear_kernels(capsys, cache_dir, command):
    fill()
    kernels = cache_dir / "kernels"
    (kernels / "sm_90a").mkdir(parents=True)
    (kernels / "sm_90a" / "a.so").write_bytes(b"x" * 10)
    (kernels / "b.so").write_bytes(b"y")
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "removed 2 compiled-kernel files" in out and str(kernels) in out
    assert "cleared 1 results" in out
    assert not kernels.exists() and ResultsCache().items() == []
    # again: nothing left, and no error
    assert main(command) == 0
    out = capsys.readouterr().out
    assert f"no compiled kernels at {kernels}" in out and "cleared 0 results" in out


def test_cache_export_import_round_trip(capsys, cache_dir, tmp_path, monkeypatch):
    record = fill()
    fill("m128_n128_k128_2d|x", "cublas", 0.01)
    export = tmp_path / "t.json"
    assert main(["cache", "export", str(export)]) == 0
    assert capsys.readouterr().out.strip() == f"exported 2 results to {export}"
    assert json.loads(export.read_text())["gemmtune_results"] == 1

    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path / "other"))
    assert ResultsCache().items() == []
    assert main(["cache", "import", str(export)]) == 0
    assert capsys.readouterr().out.strip() == f"imported 2 results from {export}"
    assert ResultsCache().lookup(KEY) == record
    assert ResultsCache().lookup("m128_n128_k128_2d|x").config == "cublas"
    assert main(["show"]) == 0
    assert f"2 results in {tmp_path / 'other' / 'results.sqlite'}" in capsys.readouterr().out


def test_cache_import_of_a_bad_file(capsys, cache_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"something": 1}')
    assert main(["cache", "import", str(bad)]) == 1
    assert "not a gemmtune results export" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["export", "import"])
def test_export_import_need_a_file(capsys, cache_dir, action):
    with pytest.raises(SystemExit) as exit_info:
        main(["cache", action])
    assert exit_info.value.code == 2
    assert f"cache {action} needs a FILE" in capsys.readouterr().err


# -- tune -----------------------------------------------------------------------------------------


def test_parse_shape():
    assert parse_shape("4096x2048x1024") == (4096, 2048, 1024, None)
    assert parse_shape("64X64X64x8") == (64, 64, 64, 8)


@pytest.mark.parametrize("shape", ["12x", "12x12", "axbxc", "1x2x3x4x5", "0x64x64", "-1x2x3"])
def test_tune_bad_shape_is_a_usage_error(capsys, shape):
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", f"--shape={shape}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: gemmtune tune" in err and "--shape" in err


def test_tune_needs_a_shape(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tune"])
    assert exit_info.value.code == 2


def test_tune_without_a_gpu(capsys, cache_dir, no_gpu):
    assert main(["tune", "--shape", "64x64x64"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("gemmtune tune needs a CUDA GPU")
    assert "Traceback" not in captured.err + captured.out and captured.out == ""


@pytest.fixture
def fake_gpu(monkeypatch, cache_dir):
    """A "GPU" for the tune command: an sm_90 problem on cuda:0, tuned by a fake tuner."""
    of_shape = GemmProblem.of_shape.__func__
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(
        GemmProblem,
        "of_shape",
        classmethod(lambda cls, *a, **kw: of_shape(cls, *a, arch=Arch.SM90, **kw)),
    )
    calls = []

    def tune(problem, **options):
        calls.append((problem, options))
        fast, slow = GemmConfig(tile_n=256, cluster_m=2), GemmConfig()
        broken = GemmConfig(tile_m=64)
        results = [
            CandidateResult(slow, 30.0, 0.30, 1e-3, final_ms=0.31),
            CandidateResult(broken, 10.0, None, error="compile: boom\nmore detail"),
            CandidateResult(fast, 20.0, 0.20, 2e-3, final_ms=0.21),
            CandidateResult(GemmConfig(swizzle=2), 25.0, 0.40, 1e-3),
        ]
        return TuneResult(problem, fast, 0.21, 2e-3, results, 500, 3, 12.0, 4.0, 9.5, {}, 0.25)

    monkeypatch.setattr(api.DISPATCHER, "tune", tune)
    return calls


def test_tune_table(capsys, fake_gpu):
    assert main(["tune", "--shape", "4096x4096x1024", "--top-k", "3", "--no-cublas"]) == 0
    ((problem, options),) = fake_gpu
    assert (problem.m, problem.n, problem.k, problem.batched) == (4096, 4096, 1024, False)
    assert problem.a_dtype is torch.bfloat16 and problem.layout == "tn"
    assert options == {"top_k": 3, "exhaustive": False, "cublas": False}
    out = capsys.readouterr().out
    assert "4096x4096x1024: bf16 -> bf16, layout tn" in out and "NVIDIA H200" in out
    fast = GemmConfig(tile_n=256, cluster_m=2).key
    rows = [line for line in out.splitlines() if line.lstrip("* ").startswith("sm90_")]
    # fastest first (side-by-side time where there is one), failures last
    assert [r.split()[0].lstrip("*") for r in rows] == [
        fast,
        GemmConfig().key,
        GemmConfig(swizzle=2).key,
        GemmConfig(tile_m=64).key,
    ]
    assert rows[0].startswith("*") and "0.2100" in rows[0] and "0.2000" in rows[0]
    tflops = 2 * 4096 * 4096 * 1024 / 0.21e-3 / 1e12
    assert f"{tflops:.1f}" in rows[0]
    assert "compile: boom" in rows[3] and "more detail" not in out
    assert f"winner: {fast}  0.2100 ms" in out
    assert "torch.matmul: 0.2500 ms" in out and "backend: gemmtune" in out
    assert "wall 9.5 s, compile 12.0 s" in out and "bench 4.0 s" in out


def test_tune_times_exactly_the_configs_named_each_one_in_the_final(capsys, fake_gpu):
    keys = ["sm90_128x128_c2x2_coop_tma_sk7_rm_s1", "sm90_64x64_c2x2_pp_tma_sk16_rm_s8"]
    assert main(["tune", "--shape", "512x512x32768", "--configs", " , ".join(keys)]) == 0
    ((_, options),) = fake_gpu
    assert [c.key for c in options["configs"]] == keys
    assert options["sweep"] == 0 and options["finalists"] == 2
    assert options["final_margin"] == float("inf") and options["cublas"] is True


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shape", "64x64x64", "--configs", "sm90_128x128"], "is not a GemmConfig key"),
        (["--shape", "64x64x64", "--configs", ","], "name at least one config key"),
        (
            [
                "--shape",
                "64x64x64",
                "--exhaustive",
                "--configs",
                "sm90_128x128_c1x1_coop_tma_dp_rm_s1",
            ],
            "not with --exhaustive",
        ),
    ],
)
def test_tune_configs_that_name_nothing_timeable_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        main(["tune", *argv])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_tune_json(capsys, fake_gpu):
    command = ["tune", "--shape", "64x128x256x4", "--dtype", "fp16", "--out-dtype", "fp32"]
    assert main([*command, "--layout", "nt", "--out-major", "m", "--exhaustive", "--json"]) == 0
    ((problem, options),) = fake_gpu
    assert problem.batched and problem.l == 4 and problem.layout == "nt"
    assert problem.out_dtype is torch.float32 and problem.out_major == "m"
    assert options == {"top_k": 8, "exhaustive": True, "cublas": True}
    report = json.loads(capsys.readouterr().out)
    assert report["problem"] == {
        "m": 64,
        "n": 128,
        "k": 256,
        "l": 4,
        "dtype": "fp16",
        "out_dtype": "fp32",
        "layout": "nt",
        "out_major": "m",
        "bias": False,
    }
    assert report["best"] == GemmConfig(tile_n=256, cluster_m=2).key
    assert report["best_ms"] == 0.21 and report["cublas_ms"] == 0.25
    assert report["backend"] == "gemmtune"
    assert (report["timed"], report["failed"], report["candidates"]) == (3, 1, 500)
    assert [r["ok"] for r in report["results"]] == [True, True, True, False]
    assert report["results"][-1]["error"].startswith("compile: boom")
    assert all(isinstance(r["config"], str) for r in report["results"])


def test_tune_with_a_bias_tunes_the_biased_bucket(capsys, fake_gpu):
    assert main(["tune", "--shape", "16x4096x4096", "--layout", "tt", "--bias"]) == 0
    ((problem, _),) = fake_gpu
    assert problem.bias and problem.out_dtype is torch.bfloat16
    assert "output n-major, plus a bias, on NVIDIA H200" in capsys.readouterr().out


def test_tune_a_problem_our_kernels_do_not_serve(capsys, fake_gpu):
    assert main(["tune", "--shape", "64x64x7"]) == 2  # rows of a of 14 bytes
    captured = capsys.readouterr()
    assert "no gemmtune kernel serves this problem (alignment:" in captured.err
    assert "Traceback" not in captured.err and captured.out == "" and fake_gpu == []


# -- bench ----------------------------------------------------------------------------------------


def test_bench_without_a_gpu(capsys, no_gpu):
    assert main(["bench", "--runs", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("gemmtune bench needs a CUDA GPU")
    assert "Traceback" not in captured.err and captured.out == ""


def test_bench_of_fp8_needs_the_layout_scaled_mm_takes(capsys):
    assert main(["bench", "--dtype", "e4m3", "--layout", "kn"]) == 2
    assert "fp8 needs --layout nk" in capsys.readouterr().err


def test_bench_adds_no_bias_to_int8_products(capsys):
    assert main(["bench", "--dtype", "int8", "--layout", "nk", "--bias"]) == 2
    assert "--bias is for 16-bit and fp8" in capsys.readouterr().err


def test_bench_with_an_unreadable_suite(capsys, tmp_path):
    assert main(["bench", "--shapes", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the shape suite" in capsys.readouterr().err


def test_bench_starts_no_shape_past_its_time_limit_and_keeps_the_rows_it_has(
    capsys, tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from gemmtune.cli import bench
    from gemmtune.measure import bandwidth, timing

    now = [100.0]
    timed = []

    def compare(shape, *args):  # each shape takes 6 s of the fake clock
        timed.append(shape["name"])
        now[0] += 6.0
        return {"shape": shape["name"], "ratio": 1.0, "correct": True}

    monkeypatch.setattr(bench, "monotonic", lambda: now[0])
    monkeypatch.setattr(bench, "compare_with_cublas", compare)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties",
        lambda _: SimpleNamespace(name="NVIDIA H200", multi_processor_count=132),
    )  # fmt: skip
    found = SimpleNamespace(read_gbps=4255.0, copy_gbps=4270.0, reference_gbps=4270.0)
    monkeypatch.setattr(bandwidth, "measure_bandwidth", lambda: found)
    monkeypatch.setattr(timing, "L2Flusher", lambda device: None)
    suite = tmp_path / "s.json"
    suite.write_text(json.dumps({"shapes": [{"name": f"s{i}", "m": 8, "n": 8, "k": 8}
                                            for i in range(3)]}))  # fmt: skip

    assert main(["bench", "--shapes", str(suite), "--json", "--time-limit", "10"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    # s0 starts at 0 s, s1 at 6 s; at 12 s the limit has passed and s2 never starts
    assert timed == ["s0", "s1"] and [r["shape"] for r in document["rows"]] == ["s0", "s1"]
    stopped = "stopped by --time-limit 10 s after 2 of 3 shapes; bf16 torch.randn inputs"
    assert stopped in document["method"]
    assert "stopped by --time-limit 10 s after 2 of 3 shapes" in captured.err

    timed.clear()
    assert main(["bench", "--shapes", str(suite), "--json"]) == 0
    assert timed == ["s0", "s1", "s2"]
    assert "stopped" not in json.loads(capsys.readouterr().out)["method"]


def test_shape_suite_ships_with_the_package(tmp_path):
    shapes = load_shape_suite()
    assert {"name": "sq4096", "m": 4096, "n": 4096, "k": 4096} in shapes
    assert all({"name", "m", "n", "k"} <= set(s) for s in shapes)
    # the benchmark scripts read the same single copy
    spec = importlib.util.spec_from_file_location("common", REPO / "benchmarks" / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    assert common.load_shapes() == shapes
    assert not (REPO / "benchmarks" / "shapes.json").exists()

    suite = tmp_path / "s.json"
    suite.write_text(json.dumps({"shapes": [{"m": 8, "n": 16, "k": 32}]}))
    assert load_shape_suite(suite) == [{"name": "8x16x32", "m": 8, "n": 16, "k": 32}]


def test_the_serving_suite_ships_too_and_says_where_each_shape_comes_from():
    shapes = load_shape_suite(suite="serving")
    names = {s["name"] for s in shapes}
    assert len(names) == len(shapes)
    decode = [s for s in shapes if s["kind"] == "decode"]
    assert sorted({s["m"] for s in decode}) == [1, 2, 4, 8, 16, 32, 64, 128]
    # every projection of both layers at every batch size, at the models' real N and K
    assert len(decode) == 2 * 4 * 8
    assert {"name": "l8b_gateup_m16", "m": 16, "n": 28672, "k": 4096}.items() <= next(
        s for s in shapes if s["name"] == "l8b_gateup_m16"
    ).items()
    assert {(s["n"], s["k"]) for s in decode if s["name"].startswith("l70b_down")} == {
        (8192, 28672)
    }
    ragged = [s for s in shapes if s["kind"] == "ragged"]
    assert ragged and all(s["m"] % 64 or s["n"] % 64 for s in ragged)
    assert all(s["source"] for s in shapes)
    with pytest.raises(KeyError, match="serving"):
        load_shape_suite(suite="nonesuch")


def test_bench_plan_config(monkeypatch):
    a, b = torch.empty(64, 32, dtype=torch.bfloat16), torch.empty(32, 16, dtype=torch.bfloat16)
    key = api.plan_key(a, b, None, None, "tune")
    config = GemmConfig()
    monkeypatch.setattr(api.DISPATCHER, "plans", {key: api.Plan(None, (), config)})
    assert plan_config(a, b, "tune") == config.key
    monkeypatch.setattr(api.DISPATCHER, "plans", {key: api.Plan(None, (), None)})
    assert plan_config(a, b, "tune") == "cublas"


def test_pretune_without_a_gpu(capsys, cache_dir, no_gpu, tmp_path):
    config = tmp_path / "model.json"
    config.write_text('{"linears": [{"name": "o", "n": 4096, "k": 4096}]}')
    assert main(["pretune", "--model-config", str(config)]) == 2
    assert main(["tune", "--model-config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("gemmtune pretune needs a CUDA GPU") == 2
    assert "Traceback" not in captured.err and captured.out == ""


def test_tune_takes_a_shape_or_a_file_of_them_not_both(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--shape", "64x64x64", "--shapes", str(tmp_path / "s.json")])
    assert exit_info.value.code == 2


def test_pretune_names_its_gemms_from_a_config_and_a_shapes_file(tmp_path):
    from gemmtune.cli import pretune

    (tmp_path / "model.json").write_text(
        '{"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,'
        ' "num_key_value_heads": 8}'
    )
    (tmp_path / "shapes.json").write_text(
        '{"shapes": [{"m": 100, "n": 200, "k": 300}, {"m": 8, "n": 64, "k": 32, "bias": true}]}'
    )
    args = build_parser().parse_args(
        ["pretune", "--model-config", str(tmp_path / "model.json"), "--batch-sizes", "1", "16",
         "--shapes", str(tmp_path / "shapes.json"), "--dtype", "fp16"]
    )  # fmt: skip
    gemms = pretune.gemms_of(args)
    assert len(gemms) == 4 * 2 + 2
    assert (gemms[0].m, gemms[0].n, gemms[0].k, gemms[0].layout) == (1, 6144, 4096, "tt")
    assert all(g.dtype == torch.float16 for g in gemms)
    assert (gemms[-2].m, gemms[-2].n, gemms[-2].k, gemms[-2].bias) == (100, 200, 300, False)
    assert (gemms[-1].m, gemms[-1].bias) == (8, True)
