"""Host time of a cached `tuned_gemm` call over `torch.mm`, in one process on the same tensors.

A 128x128x128 bf16 problem (the GPU finishes it long before the host issues the next call, so
host time is what is measured): `torch.mm(a, b)`; `tuned_gemm(a, b)` where the results cache
says our kernel won the bucket (the ranking model's first choice, stored as a tuning would store
it) and where it says cuBLAS won; `tuned_gemm(a, b, mode="off")`; the compiled kernel's
launcher called directly; and with a bias (one per column), `torch.addmm(bias, a, b)` beside
`tuned_gemm(a, b, bias=bias)` where our kernel adds it and where cuBLAS won (torch.addmm).
The cached records live in a results cache of their own, in a temporary directory, so nothing
is tuned and the user's cache is not touched. Each contender runs loops of `--calls`
back-to-back calls; one round runs one loop of every contender, in an order that rotates from
round to round, `--loops` rounds. A contender's `us` is the median of its loops' mean time per
call. Rows `dispatch_*` hold tuned_gemm's excess over torch.mm (`dispatch_*_bias`: over
torch.addmm) on the same tensors: the median over rounds of the difference between the two
loops of one round, so a host that speeds up or slows down between rounds (a shared machine
does) moves both sides of each difference alike.

    python -m benchmarks dispatch --out-dir DIR [--calls 200] [--loops 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
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


def paired_excess(ours: list[float], theirs: list[float]) -> float:
    """Median over rounds of one round's difference (ours minus theirs)."""
    return statistics.median(x - y for x, y in zip(ours, theirs, strict=True))


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks dispatch", description=SUITE_HELP)
    parser.add_argument("--calls", type=int, default=200, help="calls per loop")
    parser.add_argument("--loops", type=int, default=300, help="rounds of one loop per contender")
    parser.add_argument("--size", type=int, default=128, help="m = n = k")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from gemmtune.api.dispatch import DISPATCHER, Dispatcher, plan, tuned_gemm
    from gemmtune.cache.results import ResultsCache, TunedRecord
    from gemmtune.core.config import CUBLAS
    from gemmtune.core.problem import GemmProblem

    size = args.size
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    a2 = torch.randn(size, 2 * size, device="cuda", dtype=torch.bfloat16)  # another bucket
    b2 = torch.randn(2 * size, size, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(size, device="cuda", dtype=torch.bfloat16)
    chooser = DISPATCHER.chooser
    chooser.results = ResultsCache(Path(tempfile.mkdtemp(prefix="gemmtune-dispatch-")) / "r.db")
    for biased in (False, True):
        first = chooser.first_choice(GemmProblem.from_tensors(a, b, bias=biased))
        for x, y, config in ((a, b, first.key), (a2, b2, CUBLAS)):
            key = chooser.bucket_key(GemmProblem.from_tensors(x, y, bias=biased))
            chooser.results.store(key, TunedRecord(config=config, ms=None, how="dispatch suite"))
    ours, theirs = plan(a, b), plan(a2, b2)
    ours_biased, theirs_biased = plan(a, b, bias=bias), plan(a2, b2, bias=bias)
    if ours.config is None or theirs.config is not None or ours_biased.config is None:
        raise SystemExit(f"the cached records were not followed: {ours.reason}, {theirs.config}")
    if theirs_biased.torch_op is None:
        raise SystemExit(f"the biased cuBLAS bucket is not torch.addmm's: {theirs_biased.reason}")
    out = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
    python_keyed = Dispatcher(chooser, signature=None).gemm  # the key read from Python
    contenders = {
        "torch_mm": lambda: torch.mm(a, b),
        "tuned_gemm_ours": lambda: tuned_gemm(a, b),
        "torch_mm_cublas_bucket": lambda: torch.mm(a2, b2),
        "tuned_gemm_cublas": lambda: tuned_gemm(a2, b2),
        "tuned_gemm_off": lambda: tuned_gemm(a, b, mode="off"),
        "tuned_gemm_cublas_python_key": lambda: python_keyed(a2, b2),
        "launcher_direct": lambda: ours.launcher(a, b, out, *ours.args),
        "torch_addmm": lambda: torch.addmm(bias, a, b),
        "tuned_gemm_ours_bias": lambda: tuned_gemm(a, b, bias=bias),
        "torch_addmm_cublas_bucket": lambda: torch.addmm(bias, a2, b2),
        "tuned_gemm_cublas_bias": lambda: tuned_gemm(a2, b2, bias=bias),
    }
    for fn in contenders.values():
        mean_us(fn, 200)  # warm-up: plans made, caches and the allocator primed
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(args.loops):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(mean_us(contenders[name], args.calls))
    median = {name: statistics.median(values) for name, values in samples.items()}
    rows = [
        {"what": name, "us": round(us, 3), "runs": args.loops * args.calls}
        for name, us in median.items()
    ]
    excess = (
        ("dispatch_ours", "tuned_gemm_ours", "torch_mm", ours.config.key),
        ("dispatch_cublas", "tuned_gemm_cublas", "torch_mm_cublas_bucket", "torch.mm"),
        ("dispatch_off", "tuned_gemm_off", "torch_mm", "torch.mm"),
        ("dispatch_cublas_python_key", "tuned_gemm_cublas_python_key", "torch_mm_cublas_bucket",
         "torch.mm"),
        ("dispatch_ours_bias", "tuned_gemm_ours_bias", "torch_addmm", ours_biased.config.key),
        ("dispatch_cublas_bias", "tuned_gemm_cublas_bias", "torch_addmm_cublas_bucket",
         "torch.addmm"),
    )  # fmt: skip
    for what, name, torch_name, config in excess:
        rows.append(
            {
                "what": what,
                "us": round(paired_excess(samples[name], samples[torch_name]), 3),
                "ours_us": round(median[name], 3),
                "torch_mm_us": round(median[torch_name], 3),
                "config": config,
            }
        )
    for row in rows:
        print(f"{row['what']:>18}: {row['us']:7.3f} us")
    method = (
        f"host wall time per call, {size}^3 bf16 torch.randn, same tensors for all: loops of "
        f"{args.calls} back-to-back calls, {args.loops} rounds of one loop per contender in a "
        "rotating order; us: median of the loops' mean time per call; dispatch_*: median over "
        "rounds of tuned_gemm's loop minus torch.mm's loop of the same round, same tensors "
        "(dispatch_cublas: a bucket whose cached record is cuBLAS, 128x256x128; *_bias: with a "
        "bf16 bias per column, against torch.addmm; *_python_key: "
        f"the plan key read from Python, not by the C extension; extension built: "
        f"{DISPATCHER.signature is not None})"
    )
    return write_results("overhead", method, rows, args.out_dir)


if __name__ == "__main__":
    print(main())
