"""Our confirmed configs against QuACK's autotuned GEMM and cuBLAS, side by side.

The baselines (`../shared/bench/baselines-h200.json`) hold QuACK's ratios to cuBLAS from
another session on another H200; an H200 held at its power cap moves cuBLAS by 3-13 % from
card to card, so a bar "at least as well as QuACK" is only decided on one card, in one run.
This times `bench_confirm.CONFIRMED`'s configs, cuBLAS (`torch.mm`) and QuACK
(`quack.gemm_interface.gemm(a, b, tuned=True, split_k=None)`, the baselines' call: its
autotuner times all its SM90 configs and split-K on the first call) in alternating do_bench
rounds (`common.do_bench_rounds`) on the same `torch.randn` tensors, each verified against a
float32 reference first; then, with `--sustained-reps`, in loops of a second of back-to-back
runs (`common.sustained_rounds`), which measure what steady use gets: there a kernel's power
per cycle sets its clocks, and do_bench's short windows do not show it.

QuACK is not a dependency of gemmtune: install it beside it for this script,
`pip install --no-deps quack-kernels==0.6.5 einops` (0.6.5 runs on nvidia-cutlass-dsl 4.8.1).

    python benchmarks/bench_peers.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_confirm import Peer, compile_confirmed, confirm_shape
from common import RESULTS, TOLERANCE, load_shapes, write_results

BAR_SHAPES = ("sq4096", "sq8192", "l8b_qkv_4k", "l8b_gateup_4k", "l8b_down_4k")


def quack_peer() -> Peer:
    from quack.gemm_interface import gemm, gemm_tuned

    def make(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
        def run() -> None:
            gemm(a, b, out=out, tuned=True, split_k=None)

        run()  # the first call for a shape tunes
        c = gemm_tuned.best_config.kwargs["config"]
        chosen = (
            f"{c.tile_m}x{c.tile_n} c{c.cluster_m}x{c.cluster_n} "
            f"{'pingpong' if c.pingpong else 'cooperative'}{' swap_ab' if c.swap_ab else ''}"
            f"{f' split_k {c.split_k}' if c.split_k > 1 else ''}"
        )
        return run, chosen

    return Peer("quack", make)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sustained-reps",
        type=int,
        default=4,
        help="also time each contender in this many 1 s loops (steady use; 0: skip)",
    )
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--shapes", default=",".join(BAR_SHAPES))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    dtypes, names = args.dtypes.split(","), args.shapes.split(",")
    peers = (quack_peer(),)
    kernels = compile_confirmed(dtypes, names, args.workers)
    rows = []
    for shape in [s for s in load_shapes() if s["name"] in names]:
        for dtype in dtypes:
            shape_rows = confirm_shape(
                shape, dtype, kernels, args.rounds, peers, args.sustained_reps
            )
            rows += shape_rows
            best = max(shape_rows, key=lambda r: r["ratio"])
            print(
                f"{shape['name']:>14} {dtype} quack {best['quack_ratio']:.3f} of cuBLAS "
                f"({best['quack_config']}); ours best {best['ratio']:.3f} "
                f"({best['config'][5:]}), {best['vs_quack']:.3f} of QuACK"
                + (
                    f"; sustained: ours {best['sustained_ratio']:.3f} of cuBLAS, "
                    f"{best['vs_quack_sustained']:.3f} of QuACK"
                    if args.sustained_reps
                    else ""
                ),
                flush=True,
            )
    method = (
        f"bench_confirm.CONFIRMED configs, cuBLAS (torch.mm) and QuACK 0.6.5 (gemm(a, b, "
        f"tuned=True, split_k=None), tuned on its first call for each shape and dtype) timed "
        f"with triton.testing.do_bench (warmup 25 ms, rep 100 ms, L2 cleared each rep, "
        f"median), in turn {args.rounds} times, every other round reversed; *_ms: medians over "
        f"the rounds; ratio = cublas_ms / ours_ms, quack_ratio = cublas_ms / quack_ms, "
        f"vs_quack = quack_ms / ours_ms; inputs torch.randn, A (m,k) and B (k,n) row-major, "
        f"same tensors for every contender, each verified against a float32 reference (rel. "
        f"Frobenius error < {TOLERANCE}) first"
    )
    if args.sustained_reps:
        method += (
            f"; sustained_*: common.sustained_rounds, each contender in {args.sustained_reps} "
            f"loops of 1 s of back-to-back runs (L2 cleared before each run, the clear's time "
            f"taken off), in turn, every other rep reversed; *_sustained_ms: median ms per run "
            f"over the loops, *_mhz: the mean SM clock NVML read during them; sustained_ratio = "
            f"cublas_sustained_ms / sustained_ms, vs_quack_sustained = quack_sustained_ms / "
            f"sustained_ms"
        )
    print(f"wrote {write_results('peers', method, rows, args.out_dir)}")


if __name__ == "__main__":
    main()
