"""Shared plumbing of the benchmark scripts: environment facts and the results file format
(`benchmarks/results/<what>-<gpu>-<date>.json`, as ../shared/bench/RESULTS.md describes)."""

from __future__ import annotations

import datetime
import gzip
import importlib.metadata as metadata
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import gemmtune
from gemmtune.measure.timing import L2Flusher

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SHAPES = Path(gemmtune.__file__).resolve().parent / "measure" / "shapes.json"  # the shape suite
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: relative Frobenius error against the float32 reference above which a contender is wrong
TOLERANCE = 2e-2


def load_shapes(path: Path = SHAPES) -> list[dict]:
    return json.loads(path.read_text())["shapes"]


def gpu_tag() -> str:
    """'h100', 'h200', ... for file names."""
    name = torch.cuda.get_device_name().lower()
    for tag in ("h200", "h100", "b200", "b100", "gh200", "a100"):
        if tag in name:
            return tag
    return name.replace(" ", "-")


def versions() -> dict:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "gemmtune": gemmtune.__version__,
        "cutlass_dsl": version("nvidia-cutlass-dsl"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def write_results(
    what: str, method: str, rows: list[dict], out_dir: Path = RESULTS, compress: bool = False
) -> Path:
    """Write the results file; `compress` gzips it (`.json.gz`), for raw data sets too large to
    keep in the tree that travels to the GPU machine."""
    props = torch.cuda.get_device_properties(0)
    today = datetime.date.today().isoformat()
    doc = {
        "what": what,
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "versions": versions(),
        "date": today,
        "method": method,
        "rows": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{what}-{gpu_tag()}-{today}.json"
    if compress:
        path = path.with_suffix(".json.gz")
        path.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode()))
    else:
        path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def kernel_row(shape: str, m: int, n: int, k: int, dtype: str, config: str) -> dict:
    """The fields a kernel row (RESULTS.md) starts with: one unbatched problem, A (m,k) and
    B (k,n) row-major ("tn"); each script adds its own after them."""
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


def compile_and_load(jobs: list, workers: int) -> tuple[dict, list]:
    """Compile `jobs` (CompileJob) into a temporary folder and load them: the kernels keyed by
    (compile key, A/B dtype), and the outcomes that failed to compile."""
    from gemmtune.kernels.build import load_gemm
    from gemmtune.workers.compiler import CompilePool, compile_all

    out_dir = Path(tempfile.mkdtemp(prefix="gemmtune-bench-"))
    kernels, failed = {}, []
    pool = CompilePool("sm_90a", max_workers=workers)
    for outcome in compile_all(jobs, out_dir, pool):
        if outcome.path is None:
            failed.append(outcome)
            continue
        job = outcome.job
        kernels[(job.config.compile_key, job.signature.ab_dtype)] = load_gemm(
            outcome.path, job.config, job.signature
        )
    return kernels, failed


def do_bench_rounds(fns: list, rounds: int) -> list[list[float]]:
    """Each function's ms per round, timed the baselines' way: triton's `do_bench` (25 ms
    warm-up, 100 ms of runs, L2 cleared before each, median), the functions taken in turn
    `rounds` times, every other round in reverse order: a window's clocks depend on the window
    before it (run 5 of kernel-h200: with cuBLAS always first, our pick read 2-4 % slower than
    among the finalists)."""
    from triton.testing import do_bench

    times = [[] for _ in fns]
    for r in range(rounds):
        order = list(zip(fns, times, strict=True))
        for fn, t in order if r % 2 == 0 else reversed(order):
            t.append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return times


class Nvml:
    """NVML's readings of one GPU: its total-energy counter and its SM clock."""

    def __init__(self, index: int = 0):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def millijoules(self) -> int:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)

    def sm_mhz(self) -> int:
        return self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)


def timed_loop(
    fn: Callable[[], object], flush: Callable[[], None], runs: int, nvml: Nvml
) -> tuple[float, float, float]:
    """(ms, mJ, mean SM clock in MHz) per run of `runs` back-to-back (flush, fn) runs: CUDA
    events around the loop, NVML's energy counter read before and after, its clock sampled
    while the loop runs."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    energy = nvml.millijoules()
    begin.record()
    for _ in range(runs):
        flush()
        fn()
    end.record()
    clocks = []
    while not end.query():
        clocks.append(nvml.sm_mhz())
        time.sleep(0.005)
    torch.cuda.synchronize()
    energy = nvml.millijoules() - energy
    mhz = statistics.fmean(clocks) if clocks else math.nan
    return begin.elapsed_time(end) / runs, energy / runs, mhz


def sustained_rounds(fns: list, reps: int, seconds: float = 1.0) -> list[list[tuple[float, float]]]:
    """Each function's (ms per run, mean SM clock in MHz) over `reps` loops of `seconds` of
    back-to-back runs, L2 cleared before each run (a loop's time over its runs, less the time
    of a clear alone), the functions in turn, every other rep reversed.

    An H200 at its power cap sets its clocks from the power drawn over the last milliseconds,
    so a kernel's throughput in steady use (a serving loop) depends on its power per cycle as
    well as its cycles: do_bench's 100 ms windows start from the clocks the window before left
    (gateup: two kernels of equal cycles read from 2.7 % apart either way in do_bench rounds,
    0.5 % apart, always the same way, in these loops)."""
    nvml, flush = Nvml(torch.cuda.current_device()), L2Flusher()

    def runs_for(fn: Callable[[], object]) -> int:
        """Warm up 0.2 s; the number of runs that fill `seconds`."""
        ms = timed_loop(fn, flush, 10, nvml)[0]
        ms = timed_loop(fn, flush, max(1, int(200 / ms)), nvml)[0]
        return max(10, int(seconds * 1e3 / ms))

    flush_ms = timed_loop(lambda: None, flush, 1000, nvml)[0]
    counts = [runs_for(fn) for fn in fns]
    results: list[list[tuple[float, float]]] = [[] for _ in fns]
    for rep in range(reps):
        order = list(zip(fns, counts, results, strict=True))
        for fn, runs, out in order if rep % 2 == 0 else reversed(order):
            timed_loop(fn, flush, max(1, runs // 10), nvml)  # 10 % of the loop again as warm-up
            ms, _, mhz = timed_loop(fn, flush, runs, nvml)
            out.append((ms - flush_ms, mhz))
    return results


def do_bench_medians(fns: list, rounds: int) -> list[float]:
    """The median of each function's `do_bench_rounds`."""
    return [statistics.median(t) for t in do_bench_rounds(fns, rounds)]
