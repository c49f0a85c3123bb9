"""What a tune costs a user, and how good its choice is.

Phases (bf16, row-major A and B, each shape of the suite; `torch.randn` inputs):
- cold: a new process, an empty cache directory; the wall time of the first `tuned_gemm`
  call (tuning with cuBLAS in the final, storing, launching), with the tuner's compile and
  benchmark times. The process imports gemmtune first, as a program does at its top (its
  helpers' zygotes are forked then), makes its operands (torch's CUDA context: about 1 s) and
  calls; `since_import_s` is the wall time from the import to the call's end;
- warm: one process tunes the shapes one after another: each is a new bucket in a process
  that has tuned before (the first shape is not counted);
- cached-binaries: the same process, the results forgotten, every shape again: each tune finds
  all its binaries in the kernel cache;
- concurrent: 4 processes call `tuned_gemm` on one new bucket at once, one cache directory;
  their wall times against one process alone, and whether they agree on the winner;
- helpers: in a new process, how long compile workers (1, then 8 at once) and the benchmark
  worker take to start, and a worker's first and second compile: spawned
  (`GEMMTUNE_PRESTART=0`), and forked by the zygotes (from the import on);
- check: one process tunes each shape, then calls another shape of its bucket (m and n 7/8
  of the tuned ones, where that stays in the bucket): the wall time of that first call, whose
  shape check (`api.choice`) times the bucket's best configs on it beside torch.matmul;
- autotune: `@gemmtune.autotune` with 3 configs of a sub-millisecond function
  (`benchmarks/autotune_subject.py`) in a new process: the first call to the winner, then a
  new key.
`top_k_vs_exhaustive`: the cold tune's choice (our kernel or cuBLAS) and the three best configs
of the exhaustive search (`python -m benchmarks timings`) timed again side by side, each
alone in 50 ms windows taken in turn 3 times (the tuner's final), L2 flushed before each run:
the exhaustive search's fastest config's ms / the chosen one's (1 where the tune chose that
very config); `exhaustive_top3_min_ms` is the least of the three re-timed.

    python -m benchmarks tuning-cost --out-dir DIR [--shapes a,b] [--phases cold,warm,...]

Each phase runs in new processes (`python -m benchmarks.tuning_cost --child PHASE`) with the
repository root on their PYTHONPATH: the benchmark worker of `@autotune` imports the subject
by its module name, `benchmarks.autotune_subject`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import RESULTS, load_shapes, write_results

SUITE_HELP = "wall time of a tune: cold and warm processes, cached binaries, 4 at once, @autotune"

REPO = Path(__file__).resolve().parents[1]
PHASES = ("helpers", "cold", "warm", "cached", "concurrent", "check", "autotune")
#: the prefix of a child's result lines on its standard output
ROW = "ROW "


def emit(row: dict) -> None:
    """Report a result row to the parent process."""
    print(ROW + json.dumps(row), flush=True)


def operands(m: int, n: int, k: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 5 + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    return a, b


#: when this process imported gemmtune (`child`)
IMPORTED_AT = 0.0


def timed_call(shape: dict) -> dict:
    """The first `tuned_gemm` of `shape` in this process, with what its tune reported."""
    import torch

    from gemmtune.api import dispatch as api

    tunes = []

    def recording(problem, **options):
        tunes.append(api.DISPATCHER.chooser._default_tuner(problem, **options))
        return tunes[-1]

    api.DISPATCHER.chooser.tuner = recording
    a, b = operands(shape["m"], shape["n"], shape["k"])
    torch.cuda.synchronize()
    start = time.perf_counter()
    api.tuned_gemm(a, b)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    row = {"shape": shape["name"], "m": shape["m"], "n": shape["n"], "k": shape["k"]}
    row.update(dtype="bf16", tune_wall_s=round(wall, 3))
    row.update(since_import_s=round(time.perf_counter() - IMPORTED_AT, 3))
    if tunes:
        t = tunes[0]
        row.update(
            compile_s=round(t.compile_s, 2),
            bench_s=round(t.bench_s, 2),
            tuner_wall_s=round(t.wall_s, 3),
            compiled=t.compiled,
            cached_binaries=t.cached_binaries,
            timed=len(t.results),
            candidates=t.candidates,
            config=t.backend if t.backend == "cublas" else t.best.key,
            winner_rank=winner_rank(t),
            best_ms=round(t.best_ms, 5) if t.best_ms else None,
            cublas_ms=round(t.cublas_ms, 5) if t.cublas_ms else None,
            timeline=t.timeline,
        )
    return row


def same_bucket_shape(shape: dict) -> dict | None:
    """`shape` with m and n at 7/8 (m a multiple of 8, n of 64), where that keeps it in its
    results-cache bucket and changes it; else None."""
    from gemmtune.cache.buckets import BucketPolicy

    policy = BucketPolicy()
    m = max(8, shape["m"] * 7 // 8 // 8 * 8)
    n = max(64, shape["n"] * 7 // 8 // 64 * 64)
    if policy.round(m) != policy.round(shape["m"]):
        m = shape["m"]
    if policy.round(n) != policy.round(shape["n"]):
        n = shape["n"]
    if (m, n) == (shape["m"], shape["n"]):
        return None
    return {**shape, "name": f"{shape['name']}_7_8", "m": m, "n": n}


def helper_costs() -> None:
    """Start-up and compile costs of the helper processes, in this new process (timed from
    the import of gemmtune, whose zygotes start as it is imported)."""
    from gemmtune.core.config import GemmConfig
    from gemmtune.kernels.signature import KernelSignature
    from gemmtune.workers.bench import BenchWorker
    from gemmtune.workers.compiler import CompileJob, CompilePool

    folder = Path(tempfile.mkdtemp())
    for count in (1, 8):
        pool = CompilePool("sm_90a", max_workers=count)
        start = time.perf_counter()
        pool.reserve(count)
        for worker in pool._workers:
            worker.helper.wait_ready()
        ready = time.perf_counter() - start
        emit(
            {
                "what": "compile_workers_ready",
                "workers": count,
                "ms": round(ready * 1e3),
                "since_import_ms": round((time.perf_counter() - IMPORTED_AT) * 1e3),
            }
        )
        if count == 1:
            for tile_n in (128, 256):
                job = CompileJob(GemmConfig(tile_m=128, tile_n=tile_n), KernelSignature())
                start = time.perf_counter()
                pool.submit(job, folder).result()
                what = "first_compile" if tile_n == 128 else "second_compile"
                emit({"what": what, "ms": round((time.perf_counter() - start) * 1e3)})
        pool.stop_workers()
    worker = BenchWorker(0)
    start = time.perf_counter()
    worker.start()
    worker.helper.wait_ready()
    emit(
        {
            "what": "bench_worker_ready",
            "ms": round((time.perf_counter() - start) * 1e3),
            "since_import_ms": round((time.perf_counter() - IMPORTED_AT) * 1e3),
        }
    )
    worker.stop()


def winner_rank(result) -> int | None:
    """Where the ranking model placed our best kernel's binary among those it picked (0: its
    first choice)."""
    if result.best is None:
        return None
    order = sorted(
        (r for r in result.results if r.predicted_us is not None), key=lambda r: r.predicted_us
    )
    binaries = list(dict.fromkeys(r.config.compile_key for r in order))
    return binaries.index(result.best.compile_key) if result.best.compile_key in binaries else None


def child(mode: str, shapes: list[dict]) -> None:
    """Run one phase in this (new) process, reporting rows with `emit`."""
    global IMPORTED_AT
    IMPORTED_AT = time.perf_counter()
    import gemmtune  # noqa: F401  as a program imports it, at its top

    if mode == "helpers":
        helper_costs()
    elif mode == "cold":
        emit({**timed_call(shapes[0]), "phase": "cold"})
    elif mode == "warm":
        from gemmtune.api import dispatch as api
        from gemmtune.cache.results import ResultsCache

        timed_call(shapes[-1])  # this process has tuned before
        for shape in shapes[:-1]:
            emit({**timed_call(shape), "phase": "warm"})
        api.DISPATCHER.chooser.results = ResultsCache(Path(tempfile.mkdtemp()) / "results.sqlite")
        api.DISPATCHER.plans.clear()
        for shape in shapes[:-1]:
            emit({**timed_call(shape), "phase": "cached-binaries"})
    elif mode == "check":
        for shape in shapes:
            other = same_bucket_shape(shape)
            if other is None:
                continue
            tuned = timed_call(shape)
            emit({**timed_call(other), "phase": "check", "bucket_tuned_on": tuned["shape"]})
    elif mode == "concurrent":
        from gemmtune.api import dispatch as api

        row = timed_call(shapes[0])
        key = next(iter(api.DISPATCHER.chooser.results.items()))
        emit({**row, "winner": key[1].config, "tuned_here": "compile_s" in row})
    elif mode == "autotune":
        import torch

        from benchmarks.autotune_subject import chunked_matmul

        def call_s(m: int, n: int, k: int) -> float:
            """The wall time of one call on new (m, k) and (k, n) operands, the GPU drained."""
            x, w = operands(m, n, k)
            torch.cuda.synchronize()
            start = time.perf_counter()
            chunked_matmul(x, w)
            torch.cuda.synchronize()
            return time.perf_counter() - start

        first = call_s(2048, 1024, 1024)
        timelines = [dict(chunked_matmul.last_timeline)]
        nxt = call_s(1024, 2048, 1024)  # a new key
        timelines.append(dict(chunked_matmul.last_timeline))
        emit({"what": "autotune_first", "ms": round(first * 1e3, 1), "runs": 1, **timelines[0]})
        emit({"what": "autotune_next", "ms": round(nxt * 1e3, 1), "runs": 1, **timelines[1]})


def child_environment(cache: Path) -> dict[str, str]:
    """A child's environment: the cache folder `cache`, and the repository root first on
    PYTHONPATH, so that `benchmarks.*` imports from any working directory, in the child and in
    the helper processes it spawns."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "GEMMTUNE_CACHE_DIR": str(cache), "PYTHONPATH": path}


def child_command(mode: str, shapes: list[dict]) -> list[str]:
    names = ",".join(s["name"] for s in shapes)
    return [sys.executable, "-m", "benchmarks.tuning_cost", "--child", mode, "--shapes", names]


def run_child(
    mode: str, shapes: list[dict], cache: Path, timeout: float = 300, **env: str
) -> list[dict]:
    """Run phase `mode` in a new process on the cache folder `cache` (with `env` added to its
    environment): its rows, each with the process's wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        child_command(mode, shapes),
        capture_output=True,
        text=True,
        env={**child_environment(cache), **env},
        timeout=timeout,
    )
    wall = time.perf_counter() - start
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
    rows = [
        json.loads(line[len(ROW) :]) for line in done.stdout.splitlines() if line.startswith(ROW)
    ]
    for row in rows:
        row["process_s"] = round(wall, 2)
    return rows


def latest_timings() -> Path | None:
    """The newest `timings-<gpu>-<date>.json.gz` in the results folder (by its date)."""
    found = sorted(RESULTS.glob("timings-*.json.gz"), key=lambda p: p.name.split("-", 2)[-1])
    return found[-1] if found else None


def exhaustive_leaders(path: Path) -> dict[str, list[str]]:
    """The three fastest configs of each shape in a `timings` results file."""
    with gzip.open(path) as f:
        by_shape = defaultdict(list)
        for r in json.load(f)["rows"]:
            if r["ours_ms"] is not None:
                by_shape[r["shape"]].append((r["ours_ms"], r["config"]))
    return {shape: [c for _, c in sorted(rows)[:3]] for shape, rows in by_shape.items()}


def against_exhaustive(row: dict, leaders: list[str]) -> None:
    """Time the cold tune's choice beside the exhaustive leaders (see the module docstring)."""
    from gemmtune.core.config import CUBLAS, GemmConfig
    from gemmtune.core.problem import GemmProblem
    from gemmtune.tuning.tuner import tune

    a, b = operands(row["m"], row["n"], row["k"])
    problem = GemmProblem.from_tensors(a, b)
    chosen = row["config"]
    pool = [GemmConfig.from_key(c) for c in leaders]
    if chosen != CUBLAS:
        pool = list(dict.fromkeys([GemmConfig.from_key(chosen), *pool]))
    both = tune(
        problem,
        configs=pool,
        sweep=0,
        finalists=len(pool),
        final_margin=float("inf"),
        progress=False,
        cublas=chosen == CUBLAS,
    )
    both_final = {r.config.key: r.final_ms for r in both.results if r.final_ms is not None}
    exhaustive_ms = both_final[leaders[0]]
    chosen_ms = both.cublas_ms if chosen == CUBLAS else both_final[chosen]
    row.update(
        exhaustive_best=leaders[0],
        exhaustive_best_ms=round(exhaustive_ms, 5),
        exhaustive_top3_min_ms=round(min(both_final[c] for c in leaders if c in both_final), 5),
        chosen_ms_side_by_side=round(chosen_ms, 5),
        top_k_vs_exhaustive=round(exhaustive_ms / chosen_ms, 4),
    )


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks tuning-cost", description=SUITE_HELP
    )
    parser.add_argument("--shapes", default="", help="comma-separated names (default: all)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"of {', '.join(PHASES)}")
    parser.add_argument(
        "--exhaustive",
        type=Path,
        default=latest_timings(),
        help="the `timings` results the cold tunes' choices are compared with (default: the "
        "latest in benchmarks/results)",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    shapes = load_shapes(args.shapes)
    phases = args.phases.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phases {unknown}")
    rows: list[dict] = []
    if "helpers" in phases:
        for how, prestart in (("spawned", "0"), ("forked", "1")):
            cache = Path(tempfile.mkdtemp(prefix="gemmtune-h-"))
            for row in run_child("helpers", shapes[:1], cache, GEMMTUNE_PRESTART=prestart):
                rows.append({**row, "helpers": how})
                print(f"{how} {row['what']} ({row.get('workers', '')}): {row['ms']} ms", flush=True)
    if "cold" in phases:
        if args.exhaustive is None:
            parser.error("no timings results to compare the cold tunes with: pass --exhaustive")
        leaders = exhaustive_leaders(args.exhaustive)
        cold = []
        for shape in shapes:
            (row,) = run_child("cold", [shape], Path(tempfile.mkdtemp(prefix="gemmtune-cold-")))
            cold.append(row)
            print(
                f"cold {row['shape']:>20}: {row['tune_wall_s']:6.2f} s "
                f"(compile {row.get('compile_s')} s summed, bench {row.get('bench_s')} s) "
                f"-> {row.get('config')} {row.get('timeline')}",
                flush=True,
            )
        rows.extend(cold)
        for row in cold:
            if row["shape"] in leaders:
                against_exhaustive(row, leaders[row["shape"]])
                print(f"     {row['shape']:>20}: {row['top_k_vs_exhaustive']:.3f} of exhaustive")
    if "warm" in phases or "cached" in phases:
        # the first shape is tuned last, so the process has tuned before every counted shape
        ordered = shapes[1:] + shapes[:1]
        for row in run_child("warm", ordered, Path(tempfile.mkdtemp(prefix="gemmtune-warm-"))):
            rows.append(row)
            print(
                f"{row['phase']} {row['shape']:>20}: {row['tune_wall_s']:6.2f} s "
                f"(compiled {row.get('compiled')}, cached {row.get('cached_binaries')}) "
                f"{row.get('timeline')}"
            )
    if "concurrent" in phases:
        shape = shapes[0]
        alone = run_child("concurrent", [shape], Path(tempfile.mkdtemp(prefix="gemmtune-one-")))
        env = child_environment(Path(tempfile.mkdtemp(prefix="gemmtune-four-")))
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                child_command("concurrent", [shape]), stdout=subprocess.PIPE, text=True, env=env
            )
            for _ in range(4)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        four_s = time.perf_counter() - start
        four = [
            json.loads(line[len(ROW) :])
            for o in outs
            for line in o.splitlines()
            if line.startswith(ROW)
        ]
        row = {
            "what": "concurrent_tune",
            "shape": shape["name"],
            "processes": 4,
            "one_process_s": alone[0]["process_s"],
            "four_processes_s": round(four_s, 2),
            "ratio": round(four_s / alone[0]["process_s"], 3),
            "tuned_by": sum(r["tuned_here"] for r in four),
            "winners": sorted({r["winner"] for r in four}),
            "tune_wall_s_each": [r["tune_wall_s"] for r in four],
        }
        rows.append(row)
        print(
            f"concurrent {shape['name']}: 4 processes {four_s:.1f} s, one {row['one_process_s']} s "
            f"({row['ratio']}x); tuned by {row['tuned_by']}, winners {row['winners']}"
        )
    if "check" in phases:
        for row in run_child("check", shapes, Path(tempfile.mkdtemp(prefix="gemmtune-check-"))):
            rows.append(row)
            print(
                f"check {row['shape']:>20} (bucket tuned on {row['bucket_tuned_on']}): "
                f"{row['tune_wall_s']:6.2f} s, timed {row.get('timed')} -> {row.get('config')}"
            )
    if "autotune" in phases:
        for row in run_child("autotune", shapes[:1], Path(tempfile.mkdtemp(prefix="gemmtune-at-"))):
            rows.append(row)
            print(f"{row['what']}: {row['ms']} ms {row}")
    method = __doc__.split("\n\n")[1].replace("\n", " ")  # the phases, as described above
    return write_results("tuning-cost", method, rows, args.out_dir)


def child_main(argv: list[str]) -> None:
    """The entry of a phase's process (`child_command`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tuning_cost")
    parser.add_argument("--child", choices=PHASES, required=True)
    parser.add_argument("--shapes", default="")
    args = parser.parse_args(argv)
    child(args.child, load_shapes(args.shapes))


if __name__ == "__main__":
    child_main(sys.argv[1:])
