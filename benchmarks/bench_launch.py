"""Host time of one kernel launch through the TVM-FFI path (issue 3: at most 10 µs).

A small problem (256 x 256 x 256 bf16) is launched 1000 times back to back; the host clock is
read around each call, so this is the time the caller's thread spends per launch, not the
kernel's run time. torch.mm on the same tensors is measured the same way for reference.

    python benchmarks/bench_launch.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_results

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.build import compile_gemm
from gemmtune.kernels.launch import launch, launch_args
from gemmtune.kernels.signature import KernelSignature


def host_us(fn, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1000)
        if len(times) % 200 == 0:
            torch.cuda.synchronize()  # keep the launch queue from filling up
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    config = GemmConfig(tile_m=128, tile_n=128)
    kernel = compile_gemm(config, KernelSignature())
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    runtime = launch_args(config, a.device, 256, 256, 256, 1)
    rows = []
    for name, fn in (
        ("launch", lambda: kernel(a, b, out, *runtime)),
        ("launch_function_direct", lambda: kernel.function(a, b, out, *runtime)),
        ("launch_helper_with_workspace_lookup", lambda: launch(kernel, a, b, out, config)),
        ("torch_mm", lambda: torch.mm(a, b, out=out)),
    ):
        host_us(fn, 100)  # warm-up
        torch.cuda.synchronize()
        times = host_us(fn, args.calls)
        torch.cuda.synchronize()
        median = statistics.median(times)
        rows.append(
            {
                "what": name,
                "us": round(median, 2),
                "runs": args.calls,
                "p90_us": round(statistics.quantiles(times, n=10)[-1], 2),
            }
        )
        print(f"{name:>24}: median {median:.2f} us per call over {args.calls} calls")
    method = (
        "host wall time (perf_counter_ns) around each call, 256x256x256 bf16, "
        f"median of {args.calls} calls after 100 warm-up calls; synchronize every 200"
    )
    print(f"wrote {write_results('overhead', method, rows, args.out_dir)}")


if __name__ == "__main__":
    main()
