"""`python -m benchmarks` on a CPU: the suite list, every suite module's entry, a clear error for
an unknown suite, `--plot` and `plot` drawing PNGs, the public suite's two contenders, and the
tuning-cost children finding `benchmarks.*` by name (the suites themselves run on a GPU)."""

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from benchmarks.__main__ import SUITES
from benchmarks.__main__ import main as benchmarks_main

REPO = Path(__file__).resolve().parents[2]
EXPECTED_SUITES = (
    "public", "serving", "dispatch", "tuning-cost", "pretune", "kernel", "peers", "cache",
    "timings", "first-pass", "read-ceiling", "decode-chain", "int8-layouts", "placements",
)  # fmt: skip


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        capture_output=True, text=True, cwd=cwd, timeout=300,
    )  # fmt: skip


def results_file(tmp_path: Path, name: str, what: str, rows: list[dict]) -> Path:
    path = tmp_path / f"{name}-h200-2026-01-01.json"
    doc = {"what": what, "gpu": "NVIDIA H200", "sms": 132, "versions": {}, "date": "2026-01-01"}
    path.write_text(json.dumps({**doc, "method": "synthetic", "rows": rows}))
    return path


KERNEL_ROWS = [
    {"shape": shape, "dtype": "bf16", "contender": contender, "cublas_ms": 0.2, "ratio": ratio}
    for shape, contender, ratio in (
        ("sq4096", "tuned_gemm", 1.01),
        ("sq4096", "kernels", 0.97),
        ("l8b_qkv_128", "tuned_gemm", 1.19),
        ("l8b_qkv_128", "kernels", 1.07),
    )
]
OVERHEAD_ROWS = [
    {"what": "torch_mm", "us": 12.9, "runs": 15000},
    {"what": "dispatch_ours", "us": -2.6, "ours_us": 10.3, "torch_mm_us": 12.9},
]


def assert_png(path: Path) -> None:
    image = pytest.importorskip("matplotlib.image").imread(path)
    height, width = image.shape[:2]
    assert path.read_bytes().startswith(b"\x89PNG")
    assert width > 400 and height > 150


# -- the suite list and the suite modules -----------------------------------------------------


def test_list_names_every_suite_with_its_modules_help():
    done = run("--list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [*EXPECTED_SUITES, "plot"]
    for name, line in zip(EXPECTED_SUITES, lines, strict=False):
        help_text = importlib.import_module(SUITES[name]).SUITE_HELP
        assert line.split(None, 1)[1] == help_text


@pytest.mark.parametrize("name", EXPECTED_SUITES)
def test_each_suite_imports_and_parses_its_options_without_a_gpu(name, capsys):
    module = importlib.import_module(SUITES[name])
    assert isinstance(module.SUITE_HELP, str) and len(module.SUITE_HELP) > 20
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])  # the options of `argv`, not of sys.argv
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert f"python -m benchmarks {name}" in usage
    assert "--out-dir" in usage  # gpu_session.sh passes it to every suite


def test_an_unknown_suite_is_an_error_that_names_the_suites():
    done = run("nonesuch")
    assert done.returncode == 2
    assert "unknown suite 'nonesuch'" in done.stderr
    assert all(name in done.stderr for name in EXPECTED_SUITES)


def test_a_missing_suite_name_is_an_error():
    done = run()
    assert done.returncode == 2 and "name a suite" in done.stderr


# -- plotting ---------------------------------------------------------------------------------


def test_chart_of_kernel_rows_is_a_series_per_contender_and_dtype():
    from benchmarks.plot import chart

    _, series, reference, _ = chart({"what": "kernel", "rows": KERNEL_ROWS})
    assert reference == 1.0
    assert series == {
        "tuned_gemm bf16": {"sq4096": 1.01, "l8b_qkv_128": 1.19},
        "kernels bf16": {"sq4096": 0.97, "l8b_qkv_128": 1.07},
    }


def test_chart_of_peers_rows_keeps_each_shapes_best_config_and_adds_quack():
    from benchmarks.plot import chart

    rows = [
        {"shape": "sq4096", "dtype": "fp16", "cublas_ms": 0.2, "ratio": 0.99, "quack_ratio": 1.02},
        {"shape": "sq4096", "dtype": "fp16", "cublas_ms": 0.2, "ratio": 1.03, "quack_ratio": 1.02},
        {"shape": "sq8192", "error": "RuntimeError: relative error 1"},
    ]
    _, series, _, _ = chart({"what": "peers", "rows": rows})
    assert series == {"gemmtune fp16": {"sq4096": 1.03}, "quack fp16": {"sq4096": 1.02}}


def test_chart_of_overhead_rows_and_of_tuning_rows():
    from benchmarks.plot import chart

    _, series, reference, _ = chart({"what": "overhead", "rows": OVERHEAD_ROWS})
    assert series == {"host time": {"torch_mm": 12.9, "dispatch_ours": -2.6}}
    assert reference == 0.0
    tuning = [
        {"shape": "sq4096", "phase": "cold", "tune_wall_s": 7.1},
        {"shape": "sq4096", "phase": "warm", "tune_wall_s": 2.5},
        {"what": "autotune_first", "ms": 900.0},
        {"what": "concurrent_tune", "shape": "sq2048", "ratio": 0.98},  # not a kernel row
    ]
    _, series, reference, _ = chart({"what": "tuning-cost", "rows": tuning})
    assert series == {"cold": {"sq4096": 7.1}, "warm": {"sq4096": 2.5}}
    assert reference is None


@pytest.mark.parametrize(
    "name, what, rows",
    [
        ("public", "kernel", KERNEL_ROWS),
        ("dispatch", "overhead", OVERHEAD_ROWS),
        ("tuning-cost", "tuning-cost", [{"shape": "sq4096", "phase": "cold", "tune_wall_s": 7}]),
    ],
)
def test_plot_command_draws_a_png_of_a_results_file(tmp_path, name, what, rows):
    pytest.importorskip("matplotlib")
    results = results_file(tmp_path, name, what, rows)
    done = run("plot", str(results), "--out", str(tmp_path / "out.png"))
    assert done.returncode == 0, done.stderr
    assert_png(tmp_path / "out.png")


def test_plot_writes_beside_the_results_file_and_titles_it_with_the_gpu_and_date(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.plot import load, plot, title

    results = results_file(tmp_path, "public", "kernel", KERNEL_ROWS)
    png = plot(results)
    assert png == tmp_path / "public-h200-2026-01-01.png"
    assert_png(png)
    assert title(results, load(results)) == "public on NVIDIA H200 (132 SMs), 2026-01-01"


def test_plot_refuses_a_file_without_rows_it_can_draw(tmp_path):
    results = results_file(tmp_path, "timings", "kernel", [{"shape": "x", "ours_ms": 0.1}])
    done = run("plot", str(results))
    assert done.returncode != 0 and "no rows to plot" in done.stderr
    assert not (tmp_path / "timings-h200-2026-01-01.png").exists()


def test_plot_option_draws_what_the_suite_wrote_and_is_not_passed_to_it(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    received = []

    def fake_main(argv: list[str]) -> Path:
        received.append(argv)
        return results_file(Path(argv[argv.index("--out-dir") + 1]), "fake", "kernel", KERNEL_ROWS)

    fake = types.ModuleType("benchmarks_fake_suite")
    fake.SUITE_HELP, fake.main = "a suite that writes a synthetic file", fake_main
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(SUITES, "fake", fake.__name__)
    assert benchmarks_main(["fake", "--out-dir", str(tmp_path), "--plot", "--rounds", "2"]) == 0
    assert received == [["--out-dir", str(tmp_path), "--rounds", "2"]]
    assert_png(tmp_path / "fake-h200-2026-01-01.png")


# -- the public suite and the tuning-cost children --------------------------------------------


def test_public_runs_each_contender_in_its_own_process_and_cache(tmp_path, monkeypatch):
    from benchmarks import public

    runs, written = [], {}

    def fake_bench(command, env, **_):
        runs.append((command[command.index("--dtype") + 1], env["GEMMTUNE_CUBLAS"], env))
        assert Path(env["GEMMTUNE_CACHE_DIR"]).is_dir()
        row = {"shape": "sq4096", "ratio": 1.0, "config": "cublas", "correct": True}
        document = {"method": "gemmtune bench --mode tune: windows; bf16 torch.randn inputs"}
        return subprocess.CompletedProcess(command, 0, json.dumps({**document, "rows": [row]}))

    def fake_write(what, method, rows, out_dir, name=None):
        written.update(what=what, method=method, rows=rows, name=name)
        return out_dir / "public.json"

    monkeypatch.setattr(public.subprocess, "run", fake_bench)
    monkeypatch.setattr(public, "write_results", fake_write)
    assert public.main(["--dtype", "bf16", "fp16", "--out-dir", str(tmp_path)]).parent == tmp_path
    assert [(dtype, cublas) for dtype, cublas, _ in runs] == [
        ("bf16", "1"), ("bf16", "0"), ("fp16", "1"), ("fp16", "0"),
    ]  # fmt: skip
    assert len({env["GEMMTUNE_CACHE_DIR"] for _, _, env in runs}) == 4  # no shared records
    assert written["what"] == "kernel" and written["name"] == "public"
    tagged = [(r["dtype"], r["contender"]) for r in written["rows"]]
    assert tagged == [
        ("bf16", "tuned_gemm"), ("bf16", "kernels"), ("fp16", "tuned_gemm"), ("fp16", "kernels"),
    ]  # fmt: skip
    runs.clear()
    public.main(["--dtype", "bf16", "--contenders", "kernels", "--out-dir", str(tmp_path)])
    assert [(dtype, cublas) for dtype, cublas, _ in runs] == [("bf16", "0")]
    assert "tuned_gemm" not in written["method"]


def test_serving_runs_each_dtype_layout_and_contender_on_the_chosen_shapes(tmp_path, monkeypatch):
    from benchmarks import public, serving

    runs, written = [], {}

    def fake_bench(command, env, **_):
        suite = json.loads(Path(command[command.index("--shapes") + 1]).read_text())
        layout = command[command.index("--layout") + 1]
        runs.append((layout, env["GEMMTUNE_CUBLAS"], [s["name"] for s in suite["shapes"]]))
        rows = [
            {"shape": s["name"], "m": s["m"], "ratio": 1.1, "bw_fraction": 0.8, "layout": layout,
             "config": "sm90_x", "correct": True}
            for s in suite["shapes"]
        ]  # fmt: skip
        document = {"method": "gemmtune bench: windows; bf16 torch.randn inputs", "rows": rows}
        return subprocess.CompletedProcess(command, 0, json.dumps(document))

    def fake_write(what, method, rows, out_dir, name=None):
        written.update(what=what, rows=rows, name=name)
        return out_dir / "serving.json"

    monkeypatch.setattr(public.subprocess, "run", fake_bench)
    monkeypatch.setattr(serving, "write_results", fake_write)
    only = "l8b_down_m1,ragged_800x1200x4096,small-mn"
    argv = ["--layout", "nk", "kn", "--only", only, "--out-dir", str(tmp_path)]
    serving.main(argv)
    assert [(layout, cublas) for layout, cublas, _ in runs] == [("nk", "0"), ("kn", "0")]
    assert runs[0][2][:2] == ["l8b_down_m1", "ragged_800x1200x4096"]  # "m1" is not "m16"
    assert runs[0][2][2:] and all(name.startswith("smallmn_") for name in runs[0][2][2:])
    assert [s["name"] for s in serving.selected("l70b_o")] == [
        f"l70b_o_m{m}" for m in (1, 2, 4, 8, 16, 32, 64, 128)
    ]
    assert written["name"] == "serving" and {r["suite"] for r in written["rows"]} == {"serving"}
    assert [line.split(":")[0] for line in serving.summary(written["rows"])] == [
        "kernels bf16 kn", "kernels bf16 nk",
    ]  # fmt: skip


def test_a_suites_time_limit_is_shared_by_its_runs_as_each_starts():
    from benchmarks.public import TimeShare

    now = [50.0]
    share = TimeShare(100.0, runs=4, clock=lambda: now[0])
    assert share.next_run() == 25.0  # 100 s left for 4 runs
    now[0] += 40.0  # the first run took longer than its share
    assert share.next_run() == 20.0  # 60 s left for 3
    now[0] += 70.0
    assert share.next_run() == 0.0 and share.next_run() == 0.0  # none left: no shape starts
    assert TimeShare(None, runs=2).next_run() is None


def test_serving_passes_each_run_its_share_of_the_time_limit(tmp_path, monkeypatch):
    from benchmarks import public, serving

    limits = []

    def fake_bench(command, env, **_):
        limits.append(float(command[command.index("--time-limit") + 1]))
        row = {"shape": "l8b_o_m1", "m": 1, "ratio": 1.0, "config": "sm90_x", "correct": True}
        document = {"method": "gemmtune bench: windows; bf16 torch.randn inputs", "rows": [row]}
        return subprocess.CompletedProcess(command, 0, json.dumps(document))

    monkeypatch.setattr(public.subprocess, "run", fake_bench)
    monkeypatch.setattr(serving, "write_results", lambda *args, **kwargs: tmp_path / "s.json")
    argv = ["--only", "l8b_o_m1", "--contenders", "kernels", "tuned_gemm", "--time-limit", "300"]
    serving.main([*argv, "--out-dir", str(tmp_path)])
    assert len(limits) == 2 and 149.0 < limits[0] <= 150.0 and 298.0 < limits[1] <= 300.0


def test_tuning_cost_children_import_the_autotune_subject_by_name_from_anywhere(tmp_path):
    from benchmarks.tuning_cost import child_command, child_environment

    assert child_command("autotune", [{"name": "sq4096"}])[1:4] == [
        "-m", "benchmarks.tuning_cost", "--child",
    ]  # fmt: skip
    env = child_environment(tmp_path / "cache")
    assert env["GEMMTUNE_CACHE_DIR"] == str(tmp_path / "cache")
    # what the child and then @autotune's benchmark worker do, each in a new process, started
    # outside the repository
    child = (
        "import benchmarks.autotune_subject as subject\n"
        "from gemmtune.tuning.autotune import import_path\n"
        "print(import_path(subject.chunked_matmul.fn))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    target = done.stdout.split()[-1]
    assert target == "benchmarks.autotune_subject:chunked_matmul"
    worker = f"from gemmtune.measure.callable_runner import resolve; resolve({target!r})"
    done = subprocess.run(
        [sys.executable, "-c", worker], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr


def test_first_pass_suite_sends_the_tuners_finalists_to_the_final():
    from benchmarks.first_pass import reaches_final

    from gemmtune.tuning.tuner import FINAL_MARGIN, FINALISTS

    best = 1.0
    inside = {
        f"in{i}": best * (1 + FINAL_MARGIN * i / (FINALISTS + 1)) for i in range(FINALISTS + 2)
    }
    behind = {"behind": best * (1 + FINAL_MARGIN * 1.01)}
    chosen = reaches_final({**inside, **behind})
    # the FINALISTS fastest within the margin: not the slower ones within it, not one behind
    assert chosen == {f"in{i}" for i in range(FINALISTS)}
    assert reaches_final(behind) == {"behind"}


def test_suite_runs_with_a_bias_name_their_files_and_inputs_so():
    from benchmarks.common import suite_file_name
    from benchmarks.public import input_kind

    assert suite_file_name("serving", ["e4m3"], "tensor", "fast", True) == (
        "serving-fp8-tensor-bias"
    )
    assert suite_file_name("public", ["e4m3"], "row", "promoted", True) == (
        "public-fp8-row-promoted-bias"
    )
    assert suite_file_name("public", ["e4m3"], "tensor", "fast") == "public-fp8-tensor"
    assert suite_file_name("serving", ["bf16", "fp16"], "tensor", "fast", True) == "serving-bias"
    assert suite_file_name("serving", ["bf16"], "tensor", "fast") == "serving"
    assert "bias" in input_kind(["e4m3"], bias=True)
    assert "torch.addmm" in input_kind(["bf16"], bias=True)
    assert "bias" not in input_kind(["e4m3"]) and "bias" not in input_kind(["bf16"])


def test_rows_torch_refuses_keep_our_time_and_stay_out_of_the_ratios():
    from benchmarks import public, serving

    timed = {"contender": "kernels", "dtype": "e4m3", "layout": "tt", "m": 8, "config": "x"}
    rows = [
        {**timed, "shape": "l8b_down_m8", "ratio": 1.2, "bw_fraction": 0.8},
        {**timed, "shape": "l8b_down_m16", "ours_ms": 0.0339, "bw_fraction": 0.81,
         "torch_error": "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED"},
    ]  # fmt: skip
    assert "33.9 µs  0.81 of bw, torch refuses it" in public.describe(rows[1])
    (line,) = serving.summary(rows)
    assert "geometric mean 1.200 over 1" in line and "1 rows torch refuses" in line
