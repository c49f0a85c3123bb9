"""Host time of a cached `tuned_gemm` call over `torch.mm`, in one process on the same tensors.

A 128x128x128 bf16 problem (the GPU finishes it long before the host issues the next call, so
host time is what is measured): `torch.mm(a, b)`, `tuned_gemm(a, b, mode="heuristic")` (our
kernel, its plan cached by a first call), `tuned_gemm(a, b, mode="off")` (tuned_gemm's torch
path) and the compiled kernel's launcher called directly. Each contender runs loops of
`--calls` back-to-back calls; the loops of all contenders are interleaved, `--loops` rounds,
and the median of a contender's mean time per call is reported. Rows `dispatch_ours` and
`dispatch_cublas` hold tuned_gemm's excess over torch.mm in `us`.

    python -m benchmarks dispatch --out-dir DIR [--calls 1000] [--loops 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import RESULTS, write_results

SUITE_HELP = "host time of a cached tuned_gemm call over torch.mm (our kernel, the torch path)"


def mean_us(fn: Callable[[], object], calls: int) -> float:
    """Host µs per call over `calls` back-to-back calls; the GPU drained before and after, not
    in between (a sync per call would time the sync)."""
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter_ns() - start
    torch.cuda.synchronize()
    return elapsed / calls / 1000


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks dispatch", description=SUITE_HELP)
    parser.add_argument("--calls", type=int, default=1000, help="calls per loop")
    parser.add_argument("--loops", type=int, default=15, help="interleaved loops per contender")
    parser.add_argument("--size", type=int, default=128, help="m = n = k")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from gemmtune.api.dispatch import plan, tuned_gemm

    size = args.size
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    ours = plan(a, b, mode="heuristic")
    if ours.config is None:
        raise SystemExit(f"no kernel of ours serves {size}^3 here: {ours.reason}")
    out = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
    contenders = {
        "torch_mm": lambda: torch.mm(a, b),
        "tuned_gemm_ours": lambda: tuned_gemm(a, b, mode="heuristic"),
        "tuned_gemm_off": lambda: tuned_gemm(a, b, mode="off"),
        "launcher_direct": lambda: ours.launcher(a, b, out, *ours.args),
    }
    for fn in contenders.values():
        mean_us(fn, 200)  # warm-up: plans made, caches and the allocator primed
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.loops):
        for name, fn in contenders.items():
            samples[name].append(mean_us(fn, args.calls))
    median = {name: statistics.median(values) for name, values in samples.items()}
    rows = [
        {"what": name, "us": round(us, 3), "runs": args.loops * args.calls}
        for name, us in median.items()
    ]
    for what, name in (("dispatch_ours", "tuned_gemm_ours"), ("dispatch_cublas", "tuned_gemm_off")):
        rows.append(
            {
                "what": what,
                "us": round(median[name] - median["torch_mm"], 3),
                "ours_us": round(median[name], 3),
                "torch_mm_us": round(median["torch_mm"], 3),
                "config": ours.config.key if what == "dispatch_ours" else "torch.mm",
            }
        )
    for row in rows:
        print(f"{row['what']:>18}: {row['us']:7.3f} us")
    method = (
        f"host wall time per call, {size}^3 bf16 torch.randn, same tensors for all: loops of "
        f"{args.calls} back-to-back calls, {args.loops} loops per contender interleaved, median "
        "of the loops' mean time per call; dispatch_* = tuned_gemm minus torch.mm"
    )
    return write_results("overhead", method, rows, args.out_dir)


if __name__ == "__main__":
    print(main())
