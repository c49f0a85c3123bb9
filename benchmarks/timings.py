"""Time every config of the Hopper kernel on every shape of the suite (the exhaustive search).

Every binary the kernel implements (data-parallel, stream-K, split-K), bf16, A/B/out
row-major; split-K at every split count where the tiles leave SMs idle; then the best binaries
of each shape swept over raster order and swizzle. Each candidate is verified against a float32
reference, then timed: CUDA events, 5 ms warm-up, L2 flushed before each run, median of
`--runs`. The rows are the ground truth the ranking model is measured (and calibrated) against.

    python -m benchmarks timings --out-dir DIR [--shapes a,b]

`--match '_(192x|256x160_)' --merge benchmarks/results/timings-....json.gz` times only the
binaries whose compile key (`GemmConfig.compile_key`, no runtime fields: `_dp$` selects every
data-parallel binary) the regular expression finds, and keeps the earlier file's rows of every
other binary (after a change to some families only).
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
    TOLERANCE,
    compile_and_load,
    kernel_row,
    load_shapes,
    tflops,
    write_results,
)
from gemmtune.core.config import Decomposition, GemmConfig, Raster
from gemmtune.core.device import max_active_clusters
from gemmtune.kernels.launch import launch_args
from gemmtune.kernels.schedule_model import TileGrid
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules
from gemmtune.measure.timing import L2Flusher, time_cuda
from gemmtune.measure.verify import relative_error
from gemmtune.workers.compiler import CompileJob

SUITE_HELP = "every binary timed on the shape suite: the data the ranking model is fitted to"

SPLITS = (2, 3, 4, 6, 8, 12, 16)
SWEPT_BINARIES = 12
log = logging.getLogger(__name__)


class ShapeRun:
    """One shape's tensors and reference; `measure` verifies a config, then times it."""

    def __init__(self, m: int, n: int, k: int, kernels: dict, flush: L2Flusher, runs: int):
        torch.manual_seed(0)
        self.m, self.n, self.k = m, n, k
        self.a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        self.out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        self.ref = torch.matmul(self.a.float(), self.b.float())
        self.kernels, self.flush, self.runs = kernels, flush, runs

    def measure(self, config) -> tuple[float | None, float]:
        """(median ms or None when the output is wrong, relative error)."""
        kernel = self.kernels[(config.compile_key, "bf16")]
        args = launch_args(config, self.a.device, self.m, self.n, self.k, 1)

        def run():
            kernel(self.a, self.b, self.out, *args)

        self.out.fill_(float("nan"))
        run()
        err = relative_error(self.out, self.ref)
        if not err < TOLERANCE:
            return None, err
        return time_cuda(run, warmup_ms=5, runs=self.runs, flush=self.flush).median_ms, err


def rows_kept(rows: list[dict], match: str) -> list[dict]:
    """The rows of an earlier timings file that a run re-timing the binaries whose compile key
    `match` finds leaves standing: matched like the binaries themselves, on the compile key
    (a row's `config` is a full key, whose runtime fields end it)."""
    return [r for r in rows if not re.search(match, GemmConfig.from_key(r["config"]).compile_key)]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks timings", description=SUITE_HELP)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--shapes", default="", help="comma-separated names (default: all)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--match", default="", help="time only binaries whose compile key this regex finds"
    )
    parser.add_argument("--merge", type=Path, help="earlier timings: keep its other rows")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    configs = [
        c
        for c in rules.implemented_configs(tuple(Decomposition))
        if re.search(args.match, c.compile_key)
    ]
    jobs = [CompileJob(c, KernelSignature()) for c in configs]
    start = time.perf_counter()
    kernels, failed_outcomes = compile_and_load(jobs, workers=args.workers)
    log.info("compiled %d kernels in %.1f s", len(jobs), time.perf_counter() - start)
    failed = [o.job.name for o in failed_outcomes]
    flush = L2Flusher()
    method = (
        f"exhaustive: every implemented binary (data-parallel, stream-K, split-K at splits "
        f"{SPLITS} where units < resident clusters) at raster along_m, swizzle 1, then the best "
        f"{SWEPT_BINARIES} binaries per shape at every raster x swizzle; CUDA events, 5 ms "
        f"warm-up, L2 flushed before each run, median of {args.runs} runs; torch.randn bf16; "
        f"verified against a float32 reference first (ours_ms null: rejected). Compile "
        f"failures: {failed}"
    )
    rows = []
    if args.merge:
        with gzip.open(args.merge) as f:
            earlier = json.load(f)
        rows = rows_kept(earlier["rows"], args.match)
        method += (
            f"; binaries with '{args.match}' in their compile key timed on "
            f"{datetime.date.today()}, "
            f"the others' rows from {args.merge.name} (its method: {earlier['method']})"
        )
    for shape in load_shapes(args.shapes):
        m, n, k = shape["m"], shape["n"], shape["k"]
        run = ShapeRun(m, n, k, kernels, flush, args.runs)
        start = time.perf_counter()
        timed = []
        for config in configs:
            if (config.compile_key, "bf16") not in kernels:
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
            if config.compile_key not in {c.compile_key for c in seen}:
                seen.append(config)
            if len(seen) == SWEPT_BINARIES:
                break
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
                    **kernel_row(shape["name"], m, n, k, "bf16", config.key),
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
