"""What the benchmark suites share: the results file format (`benchmarks/README.md`), the shape
suite, kernel rows, compiling a list of configs, and timing the baselines' way (do_bench)."""

from __future__ import annotations

import datetime
import gzip
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from gemmtune.cli.bench import load_shape_suite
from gemmtune.core.dtypes import KERNEL_INPUTS, torch_dtype
from gemmtune.core.versions import software
from gemmtune.measure.verify import tolerance

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = {name: torch_dtype(name) for name in KERNEL_INPUTS}
#: relative Frobenius error against the float32 reference above which a bf16 result is wrong
TOLERANCE = tolerance(torch.bfloat16)


def load_shapes(names: str = "") -> list[dict]:
    """The shapes of the shape suite named in `names` (comma-separated, in that order; empty:
    all), read from the one copy gemmtune ships (`gemmtune bench` reads it too)."""
    shapes = load_shape_suite()
    if not names:
        return shapes
    by_name = {shape["name"]: shape for shape in shapes}
    wanted = names.split(",")
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}: the suite has {', '.join(by_name)}")
    return [by_name[name] for name in wanted]


def gpu_tag(device_name: str | None = None) -> str:
    """'h100', 'h200', ... for file names: of `device_name`, else of this process's GPU."""
    name = (device_name or torch.cuda.get_device_name()).lower()
    for tag in ("h200", "h100", "b200", "b100", "gh200", "a100"):
        if tag in name:
            return tag
    return name.replace(" ", "-")


def suite_file_name(
    suite: str, dtypes: list[str], scaling: str, accumulation: str, bias: bool = False
) -> str:
    """The results file name of a suite run: the suite's (16-bit inputs), `<suite>-int8`, or
    `<suite>-fp8-<scaling>[-promoted]` where those types are measured; `-bias` where both
    contenders add one."""
    biased = "-bias" if bias else ""
    if set(dtypes) & {"e4m3", "e5m2"}:
        promoted = "-promoted" if accumulation == "promoted" else ""
        return f"{suite}-fp8-{scaling}{promoted}{biased}"
    return f"{suite}-int8" if "int8" in dtypes else f"{suite}{biased}"


def write_results(
    what: str,
    method: str,
    rows: list[dict],
    out_dir: Path = RESULTS,
    compress: bool = False,
    name: str | None = None,
) -> Path:
    """Write the results file `<name or what>-<gpu>-<date>.json`; `compress` gzips it
    (`.json.gz`), for raw data sets too large to keep in the tree that travels to the GPU
    machine."""
    props = torch.cuda.get_device_properties(0)
    today = datetime.date.today().isoformat()
    doc = {
        "what": what,
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "versions": software(),
        "date": today,
        "method": method,
        "rows": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name or what}-{gpu_tag()}-{today}.json"
    if compress:
        path = path.with_suffix(".json.gz")
        path.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode()))
    else:
        path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def kernel_row(shape: str, m: int, n: int, k: int, dtype: str, config: str) -> dict:
    """The fields a kernel row starts with: one unbatched problem, A (m,k) and B (k,n)
    row-major ("tn"); each suite adds its own after them."""
    return {
        "shape": shape,
        "m": m,
        "n": n,
        "k": k,
        "l": 1,
        "dtype": dtype,
        "layout": "tn",
        "config": config,
    }


def tflops(m: int, n: int, k: int, l: int, ms: float) -> float:
    return 2 * m * n * k * l / (ms * 1e-3) / 1e12


def against_cublas(m: int, n: int, k: int, ours_ms: float, cublas_ms: float) -> dict:
    """The timing fields of a kernel row: both medians, their ratio and both rates."""
    return {
        "ours_ms": round(ours_ms, 5),
        "cublas_ms": round(cublas_ms, 5),
        "ratio": round(cublas_ms / ours_ms, 4),
        "ours_tflops": round(tflops(m, n, k, 1, ours_ms), 1),
        "cublas_tflops": round(tflops(m, n, k, 1, cublas_ms), 1),
    }


def compile_and_load(jobs: list, workers: int, target: str = "sm_90a") -> tuple[dict, list]:
    """Compile `jobs` (CompileJob) for `target` into a temporary folder and load them: the
    kernels keyed by (compile key, A/B dtype), and the outcomes that failed to compile."""
    from gemmtune.kernels.build import load_gemm
    from gemmtune.workers.compiler import CompilePool, compile_all

    out_dir = Path(tempfile.mkdtemp(prefix="gemmtune-bench-"))
    kernels, failed = {}, []
    pool = CompilePool(target, max_workers=workers)
    for outcome in compile_all(jobs, out_dir, pool):
        if outcome.path is None:
            failed.append(outcome)
            continue
        job = outcome.job
        kernels[(job.config.compile_key, job.signature.ab_dtype)] = load_gemm(
            outcome.path, job.config, job.signature
        )
    return kernels, failed


def do_bench_rounds(fns: list[Callable[[], object]], rounds: int) -> list[list[float]]:
    """Each function's ms per round, timed the baselines' way: triton's `do_bench` (25 ms
    warm-up, 100 ms of runs, L2 cleared before each, median), the functions taken in turn
    `rounds` times, every other round in reverse order: a window's clocks depend on the window
    before it (with cuBLAS always first, a config read 2-4 % slower than among the
    finalists)."""
    from triton.testing import do_bench

    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = list(zip(fns, times, strict=True))
        for fn, t in order if r % 2 == 0 else reversed(order):
            t.append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return times


def do_bench_medians(fns: list[Callable[[], object]], rounds: int) -> list[float]:
    """The median of each function's `do_bench_rounds`."""
    return [statistics.median(t) for t in do_bench_rounds(fns, rounds)]
