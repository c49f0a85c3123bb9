"""Time every config of the Hopper kernel on every shape of the suite (the exhaustive search).

Every binary the kernel implements (data-parallel, stream-K, split-K); split-K at every split
count where the tiles leave SMs idle; then the best binaries of each shape swept over raster
order and swizzle. bf16 inputs with A, B and the output row-major, or (`--dtype e4m3|int8`)
8-bit inputs with A and B K-major as 8-bit WGMMAs read them (`x @ w.t()`): e4m3 with unit-range
per-tensor scales into bf16, int8 into int32. Each candidate is verified against a float32
reference (int8: the exact product), then timed: CUDA events, 5 ms warm-up, L2 flushed before
each run, median of `--runs`. The rows are the ground truth the ranking model is measured (and
calibrated) against; `--extra 2050x2112x2000,...` adds problems outside the shape suite.

    python -m benchmarks timings --out-dir DIR [--shapes a,b] [--dtype e4m3]

`--match '_(192x|256x160_)' --merge benchmarks/results/timings-....json.gz` times only the
binaries whose compile key (`GemmConfig.compile_key`, no runtime fields: `_dp$` selects every
data-parallel binary) the regular expression finds on the shapes named, and keeps the earlier
file's rows of every other binary and every other shape (after a change to some families, or
to re-time some shapes).

At the power cap a GPU sets its clocks from the power of the last milliseconds, so a large
GEMM timed right after a binary that draws less runs faster than it does in steady use: an
fp8 8192^3 config timed 10-15 % faster after a direct-store binary than in a later sweep with
a 5 ms warm-up. `--warmup-ms` (40 and more for such shapes) lets each config reach its own
clocks first. The suites and the tuner's final time each contender in windows of flushed, held
runs instead, where the same configs read 13-17 % faster and in another order
(`docs/ranking.md`, 8-bit problems); `--windows 30` times every config so, each window after
one of torch's product on the same tensors, so that every config starts from the clocks the
final's contenders leave.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import logging
import re
import time
from pathlib import Path

import torch

from benchmarks.common import (
    RESULTS,
    compile_and_load,
    kernel_row,
    load_shapes,
    tflops,
    write_results,
)
from gemmtune.core.config import Decomposition, GemmConfig, Raster
from gemmtune.core.device import max_active_clusters
from gemmtune.kernels.launch import kernel_scales, launch_args
from gemmtune.kernels.schedule_model import TileGrid
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules
from gemmtune.measure.runner import (
    random_scales,
    random_tensor,
    reference_product,
    torch_product,
)
from gemmtune.measure.timing import L2Flusher, time_cuda, time_in_windows
from gemmtune.measure.verify import check, poison
from gemmtune.workers.compiler import CompileJob

SUITE_HELP = "every binary timed on the shape suite: the data the ranking model is fitted to"

SPLITS = (2, 3, 4, 6, 8, 12, 16)
SWEPT_BINARIES = 12
#: The signature timed per input type: bf16 row-major; 8-bit K-major (what its WGMMAs read),
#: fp8 scaled per tensor into bf16.
SIGNATURES = {
    "bf16": KernelSignature(),
    "e4m3": KernelSignature("e4m3", "bf16", "k", "k", scaling="tensor"),
    "int8": KernelSignature("int8", "int32", "k", "k"),
}
SIGNATURE_TEXT = {
    "bf16": "torch.randn bf16, a, b and out row-major",
    "e4m3": "torch.randn rounded to e4m3, a row-major and b column-major (x @ w.t()), scales "
    "per tensor from [0.5, 1.5), bf16 out",
    "int8": "int8 drawn from all 256 values, a row-major and b column-major, int32 out",
}
log = logging.getLogger(__name__)


class ShapeRun:
    """One shape's tensors and reference; `measure` verifies a config, then times it."""

    def __init__(
        self,
        m: int,
        n: int,
        k: int,
        signature: KernelSignature,
        kernels: dict,
        flush: L2Flusher,
        runs: int,
        warmup_ms: float = 5.0,
        window_ms: float = 0.0,
        max_runs: int = 2000,
    ):
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.m, self.n, self.k, self.signature = m, n, k, signature
        self.a = random_tensor((m, k), signature.ab_torch_dtype, "cuda", gen)
        if signature.b_major == "k":
            self.b = random_tensor((n, k), signature.b_torch_dtype, "cuda", gen).t()
        else:
            self.b = random_tensor((k, n), signature.b_torch_dtype, "cuda", gen)
        self.out = torch.empty(m, n, device="cuda", dtype=signature.out_torch_dtype)
        scales = random_scales(signature, m, n, "cuda", gen)
        self.scales = kernel_scales(scales)
        self.ref = reference_product(self.a, self.b, scales)
        # each config in a window of `window_ms` (at most `max_runs` runs) after one of
        # torch's product; 0: `runs` runs after the warm-up
        self.window_ms, self.max_runs = window_ms, max_runs

        def contender() -> None:
            torch_product(self.a, self.b, scales, self.out.dtype)

        self.contender = contender
        self.kernels, self.flush, self.runs, self.warmup_ms = kernels, flush, runs, warmup_ms

    def measure(self, config) -> tuple[float | None, float]:
        """(median ms or None when the output is wrong, relative error)."""
        kernel = self.kernels[(config.compile_key, self.signature.ab_dtype)]
        args = launch_args(
            config, self.a.device, self.m, self.n, self.k, 1, ab_bytes=self.signature.ab_bytes
        )

        def run():
            kernel(self.a, self.b, self.out, *self.scales, *args)

        poison(self.out)
        run()
        ok, err = check(self.out, self.ref, self.signature.ab_torch_dtype)
        if not ok:
            return None, err
        if self.window_ms:
            _, timing = time_in_windows(
                [self.contender, run],
                window_ms=self.window_ms,
                rounds=1,
                warmup_ms=self.warmup_ms,
                max_runs=self.max_runs,
                flush=self.flush,
            )
        else:
            timing = time_cuda(run, warmup_ms=self.warmup_ms, runs=self.runs, flush=self.flush)
        return timing.median_ms, err


def extra_shapes(text: str) -> list[dict]:
    """Problems named by their sizes, `MxNxK` comma-separated, as shape-suite entries."""
    shapes = []
    for item in filter(None, text.split(",")):
        try:
            m, n, k = (int(v) for v in item.split("x"))
        except ValueError:
            raise SystemExit(f"--extra {item!r}: give MxNxK") from None
        shapes.append({"name": item, "m": m, "n": n, "k": k})
    return shapes


def rows_kept(rows: list[dict], match: str, shapes: set[str] | None = None) -> list[dict]:
    """The rows of an earlier timings file that a run re-timing the binaries whose compile key
    `match` finds, on `shapes` (by default every shape), leaves standing: matched like the
    binaries themselves, on the compile key (a row's `config` is a full key, whose runtime
    fields end it)."""
    return [
        r
        for r in rows
        if (shapes is not None and r["shape"] not in shapes)
        or not re.search(match, GemmConfig.from_key(r["config"]).compile_key)
    ]


def timed_how(args: argparse.Namespace) -> str:
    """What each timing is the median of, for the results file's method."""
    if args.windows:
        return (
            f"median of a window of {args.windows:g} ms (at most {args.max_runs} runs) of held "
            f"runs (measure.timing.time_in_windows), after a window of torch's product on the "
            f"same tensors"
        )
    return f"median of {args.runs} runs after the warm-up"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks timings", description=SUITE_HELP)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--shapes", default="", help="comma-separated names (default: all)")
    parser.add_argument("--extra", default="", help="more problems, MxNxK comma-separated")
    parser.add_argument("--dtype", choices=tuple(SIGNATURES), default="bf16")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--match", default="", help="time only binaries whose compile key this regex finds"
    )
    parser.add_argument("--merge", type=Path, help="earlier timings: keep its other rows")
    parser.add_argument("--warmup-ms", type=float, default=5.0, help="per config and shape")
    parser.add_argument(
        "--windows",
        type=float,
        default=0.0,
        metavar="MS",
        help="time each config in a window of MS ms after one of torch's product",
    )
    parser.add_argument(
        "--max-runs",
        type=int,
        default=2000,
        help="at most this many runs per window: a short kernel's window is mostly flushes",
    )
    parser.add_argument(
        "--sweep",
        type=int,
        default=SWEPT_BINARIES,
        help="binaries per shape timed at every raster and swizzle",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signature = SIGNATURES[args.dtype]
    configs = [
        c
        for c in rules.implemented_configs(tuple(Decomposition))
        if re.search(args.match, c.compile_key) and rules.signature_reason(c, signature) is None
    ]
    jobs = [CompileJob(c, signature) for c in configs]
    start = time.perf_counter()
    kernels, failed_outcomes = compile_and_load(jobs, workers=args.workers)
    log.info("compiled %d kernels in %.1f s", len(jobs), time.perf_counter() - start)
    failed = [o.job.name for o in failed_outcomes]
    flush = L2Flusher()
    method = (
        f"exhaustive: every implemented binary (data-parallel, stream-K, split-K at splits "
        f"{SPLITS} where units < resident clusters) at raster along_m, swizzle 1, then the best "
        f"{args.sweep} binaries per shape at every raster x swizzle; CUDA events, "
        f"{args.warmup_ms:g} ms warm-up, L2 flushed before each run, {timed_how(args)}; "
        f"{SIGNATURE_TEXT[args.dtype]}; verified against a float32 reference first (int8: the "
        f"exact product; ours_ms null: rejected). Compile failures: {failed}"
    )
    rows = []
    shapes = load_shapes(args.shapes) if args.shapes or not args.extra else []
    shapes += extra_shapes(args.extra)
    if args.merge:
        with gzip.open(args.merge) as f:
            earlier = json.load(f)
        names = {shape["name"] for shape in shapes}
        rows = rows_kept(earlier["rows"], args.match, names)
        method += (
            f"; binaries with '{args.match}' in their compile key timed on "
            f"{datetime.date.today()} on {', '.join(sorted(names))}, the other rows from "
            f"{args.merge.name} (its method: {earlier['method']})"
        )
    window = (args.windows, args.max_runs)
    for shape in shapes:
        m, n, k = shape["m"], shape["n"], shape["k"]
        run = ShapeRun(m, n, k, signature, kernels, flush, args.runs, args.warmup_ms, *window)
        start = time.perf_counter()
        timed = []
        for config in configs:
            if (config.compile_key, args.dtype) not in kernels:
                continue
            variants = [config]
            if config.decomposition is Decomposition.SPLIT_K:
                clusters = max_active_clusters(config.cluster_m * config.cluster_n, 0)
                grid = TileGrid.of(config, m, n, 1)
                if grid.work_units >= clusters:
                    continue
                variants = [config.with_runtime(splits=s) for s in SPLITS]
            for variant in variants:
                ms, err = run.measure(variant)
                timed.append((ms, variant, err))
        ok = sorted((t for t in timed if t[0] is not None), key=lambda t: t[0])
        seen = []
        for _, config, _ in ok:
            if len(seen) >= args.sweep:
                break
            if config.compile_key not in {c.compile_key for c in seen}:
                seen.append(config)
        for config in seen:
            for raster in Raster:
                for swizzle in (1, 2, 4, 8):
                    variant = config.with_runtime(raster=raster, swizzle=swizzle)
                    if variant != config:
                        ms, err = run.measure(variant)
                        timed.append((ms, variant, err))
        for ms, config, err in timed:
            rows.append(
                {
                    **kernel_row(shape["name"], m, n, k, args.dtype, config.key),
                    "layout": "tn" if signature.b_major == "n" else "tt",
                    "ours_ms": None if ms is None else round(ms, 5),
                    "ours_tflops": None if ms is None else round(tflops(m, n, k, 1, ms), 1),
                    "rel_err": round(err, 6),
                }
            )
        best = min((t for t in timed if t[0] is not None), key=lambda t: t[0])
        print(
            f"{shape['name']:>20}: {len(timed)} timed in {time.perf_counter() - start:.1f} s, "
            f"best {best[1].key} {tflops(m, n, k, 1, best[0]):.1f} TF, "
            f"{sum(t[0] is None for t in timed)} rejected",
            flush=True,
        )
        # after every shape, so that a run cut short keeps what it measured
        write_results("timings", method, rows, args.out_dir, compress=True)
    return write_results("timings", method, rows, args.out_dir, compress=True)


if __name__ == "__main__":
    print(main())
