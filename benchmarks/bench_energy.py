"""Energy per GEMM and time, each kernel alone for seconds, against cuBLAS (issue 3's regimes).

At its power cap an H200's clocks follow its power draw, so a kernel run on its own for
seconds is as fast as its energy per FLOP and its cycles allow. For each shape and contender:
a loop of (L2 flush, GEMM) for `--seconds`, timed with two CUDA events, with NVML's total-energy
counter read before and after; the same loop with the flush alone is subtracted. Contenders
take turns, `--reps` times. Inputs `torch.randn` bf16, the same tensors for every contender,
each checked against a float32 reference (output poisoned with NaN) first.

    python benchmarks/bench_energy.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    RESULTS,
    TOLERANCE,
    Nvml,
    compile_and_load,
    kernel_row,
    load_shapes,
    tflops,
    timed_loop,
    write_results,
)

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.launch import launch_args
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.timing import L2Flusher
from gemmtune.measure.verify import relative_error
from gemmtune.workers.compiler import CompileJob

# the sustained and the do_bench picks of kernel-h200-2026-11-21.json (run 4)
CONTENDERS = {
    "sq4096": [
        GemmConfig(tile_m=128, tile_n=256, cluster_m=2, raster="along_n", swizzle=8),
        GemmConfig(tile_m=128, tile_n=128, cluster_m=2, schedule="pingpong"),
    ],
    "l8b_down_4k": [
        GemmConfig(tile_m=128, tile_n=256, cluster_m=2, raster="along_n", swizzle=8),
        GemmConfig(tile_m=128, tile_n=128, cluster_m=2, schedule="pingpong", swizzle=2),
    ],
    "wave_2k_2304": [
        GemmConfig(tile_m=192, tile_n=192, swizzle=2),
        GemmConfig(tile_m=192, tile_n=192, cluster_n=2, raster="along_n", swizzle=4),
    ],
}


def run_loop(fn, flush: L2Flusher, meter: Nvml, seconds: float) -> tuple[float, float]:
    """(ms, mJ) per (flush, fn) run over a loop of about `seconds`."""
    for _ in range(100):
        flush()
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        flush()
        fn()
    torch.cuda.synchronize()
    runs = max(100, int(seconds * 50 / (time.perf_counter() - start)))
    ms, mj, _ = timed_loop(fn, flush, runs, meter)
    return ms, mj


def bench_shape(
    shape: dict, kernels: dict, flush: L2Flusher, meter: Nvml, seconds: float, reps: int
) -> list[dict]:
    m, n, k = shape["m"], shape["n"], shape["k"]
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    contenders = {"cublas": lambda: torch.mm(a, b, out=out)}
    for config in CONTENDERS[shape["name"]]:
        kernel = kernels[(config.compile_key, "bf16")]
        launch = launch_args(config, a.device, m, n, k, 1)
        contenders[config.key] = lambda kernel=kernel, launch=launch: kernel(a, b, out, *launch)
    reference = torch.matmul(a.float(), b.float())
    for name, fn in contenders.items():
        out.fill_(float("nan"))
        fn()
        err = relative_error(out, reference)
        if not err < TOLERANCE:
            raise RuntimeError(f"{shape['name']}: {name} is wrong (relative error {err})")
    rows = []
    for rep in range(reps):
        flush_ms, flush_mj = run_loop(lambda: None, flush, meter, seconds)
        measured = {}
        for name, fn in contenders.items():
            ms, mj = run_loop(fn, flush, meter, seconds)
            measured[name] = (ms - flush_ms, mj - flush_mj, mj / ms)
        cublas_ms = measured["cublas"][0]
        for name, (ms, mj, watts) in measured.items():
            rows.append(
                {
                    **kernel_row(shape["name"], m, n, k, "bf16", name),
                    "rep": rep,
                    "ours_ms": round(ms, 5),
                    "ratio": round(cublas_ms / ms, 4),
                    "ours_tflops": round(tflops(m, n, k, 1, ms), 1),
                    "mj_per_gemm": round(mj, 2),
                    "avg_power_w": round(watts, 1),
                }
            )
            print(
                f"{shape['name']:>14} rep{rep} {name:40s} {ms * 1e3:8.1f} us "
                f"{mj:7.1f} mJ  {watts:5.0f} W  ratio {cublas_ms / ms:.3f}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.5)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    configs = {c.compile_key: c for cs in CONTENDERS.values() for c in cs}
    jobs = [CompileJob(c, KernelSignature()) for c in configs.values()]
    kernels, failed = compile_and_load(jobs, workers=8)
    if failed:
        raise RuntimeError(f"compile failed: {failed[0].job.name}: {failed[0].error}")
    flush, meter = L2Flusher(), Nvml()
    rows = []
    for shape in load_shapes():
        if shape["name"] in CONTENDERS:
            rows += bench_shape(shape, kernels, flush, meter, args.seconds, args.reps)
    method = (
        f"each contender alone in a loop of (L2 flush, GEMM) for ~{args.seconds} s, timed with "
        f"two CUDA events, NVML total-energy counter read before and after; a flush-only loop "
        f"measured the same way subtracted (ours_ms, mj_per_gemm); avg_power_w: the whole "
        f"loop's; contenders in turn, {args.reps} reps; ratio = cuBLAS ms / ms in the same rep; "
        f"torch.randn bf16, A (m,k) and B (k,n) row-major, same tensors for every contender, "
        f"each verified against a float32 reference (rel. error < {TOLERANCE}) first"
    )
    path = write_results("energy", method, rows, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
