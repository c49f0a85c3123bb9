"""Back-to-back launches with and without programmatic dependent launch (PDL).

Our kernels are launched as dependent launches: their prologue (barrier set-up, descriptor
prefetch, the cluster's first sync) runs while the kernel before them in the stream drains,
and they wait (`griddepcontrol.wait`) only before touching global memory. This measures what
that saves where it matters: chains of short GEMMs, as in a model's decode step. Each case is
built twice, dependent (as shipped) and plain, and timed in two patterns: 50 GEMMs back to back,
and 50 (elementwise add, GEMM) pairs; per launch, median over the reps, the builds alternating.
Hot L2 (a chain reuses its operands, as a serving loop does).

    python benchmarks/bench_back_to_back.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_results

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.build import compile_gemm
from gemmtune.kernels.launch import launch_args
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.verify import relative_error

# (config key, m, n, k): a decode-sized projection, a tiny GEMM, a large one for scale
CASES = (
    ("sm90_128x128_c1x1_coop_tma_dp_rm_s8", 128, 6144, 4096),
    ("sm90_128x64_c1x1_coop_tma_dp_rm_s8", 64, 2048, 2048),
    ("sm90_128x256_c2x1_coop_tma_dp_rm_s8", 4096, 4096, 4096),
)
CHAIN = 50


def per_launch_us(pattern, gemm) -> float:
    """One timed pass of `pattern` over `gemm`, after an untimed one: µs per launch."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    pattern(gemm)
    start.record()
    pattern(gemm)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / CHAIN


def measure(key: str, m: int, n: int, k: int, reps: int) -> list[dict]:
    config, signature = GemmConfig.from_key(key), KernelSignature()
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    args = launch_args(config, a.device, m, n, k, 1)
    gemms = {}
    for dependent in (True, False):
        kernel = compile_gemm(config, signature, dependent_launch=dependent)
        gemms[dependent] = lambda kernel=kernel: kernel(a, b, out, *args)
        out.fill_(float("nan"))
        gemms[dependent]()
        error = relative_error(out, ref)
        if not error < 1e-2:
            raise RuntimeError(f"{key} (dependent_launch={dependent}): relative error {error}")
    patterns = {
        "gemm_chain": lambda gemm: [gemm() for _ in range(CHAIN)],
        "add_then_gemm": lambda gemm: [(x.add_(1.0), gemm()) for _ in range(CHAIN)],
    }
    rows = []
    for name, pattern in patterns.items():
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(reps):
            for dependent in (True, False) if rep % 2 == 0 else (False, True):
                times[dependent].append(per_launch_us(pattern, gemms[dependent]))
        dependent_us, plain_us = statistics.median(times[True]), statistics.median(times[False])
        rows.append(
            {
                "what": name,
                "m": m,
                "n": n,
                "k": k,
                "dtype": "bf16",
                "config": key,
                "dependent_us": round(dependent_us, 2),
                "plain_us": round(plain_us, 2),
                "saved_us": round(plain_us - dependent_us, 2),
                "speedup": round(plain_us / dependent_us, 4),
                "reps": reps,
            }
        )
        print(
            f"{m}x{n}x{k} {name:>14}: dependent {dependent_us:8.2f} us, plain {plain_us:8.2f} us "
            f"per launch ({plain_us / dependent_us:.3f}x)",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = [row for case in CASES for row in measure(*case, args.reps)]
    method = (
        f"CUDA events around {CHAIN} launches back to back (gemm_chain) or {CHAIN} pairs of an "
        f"in-place add on an (m, n) tensor and the GEMM (add_then_gemm), each timed pass after an "
        f"untimed one; per-launch time, median of {args.reps} reps, the dependent and plain builds "
        "alternating; hot L2; torch.randn bf16 inputs, both builds verified against a float32 "
        "reference first"
    )
    print(f"wrote {write_results('back-to-back', method, rows, args.out_dir)}")


if __name__ == "__main__":
    main()
