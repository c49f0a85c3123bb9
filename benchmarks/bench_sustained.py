"""Configs in steady use: each in loops of a second of back-to-back runs beside cuBLAS and QuACK.

On an H200 at its power cap, kernels that keep all 132 SMs busy run a large GEMM in about the
same number of cycles (gateup: 2.12-2.17 M for cuBLAS, QuACK and twenty variants of our 256x208
tile), so what orders them is the clock their power per cycle leaves them, which the L2 and
HBM traffic of their tile order moves by percents. This times any configs (raster orders and
swizzles included) in `common.sustained_rounds` on one shape, where `bench_peers.py` times
only the confirmed ones.

    python benchmarks/bench_sustained.py --shape l8b_gateup_4k \
        --configs sm90_256x208_c1x2_swap_coop_tma_dp_rm_s8,sm90_256x208_c1x2_swap_coop_tma_dp_rm_s4

QuACK is timed beside them (`--quack tuned`, the default: its autotuned pick, as in
`bench_peers.py`; `--quack 256x208,1x2,swap`: one of its configs; `--quack none`: not).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_confirm import Peer, compile_configs, sustained_fields, verified_contenders
from common import (
    RESULTS,
    TOLERANCE,
    kernel_row,
    load_shapes,
    sustained_rounds,
    tflops,
    write_results,
)

from gemmtune.core.config import GemmConfig


def quack_fixed_peer(spec: str) -> Peer:
    """QuACK at one of its own configs: "TMxTN,CMxCN[,swap][,pingpong]"."""
    from quack.gemm_config import GemmConfig as QuackConfig
    from quack.gemm_interface import gemm_tuned

    tile, cluster, *flags = spec.split(",")
    (tile_m, tile_n), (cluster_m, cluster_n) = (map(int, x.split("x")) for x in (tile, cluster))
    config = QuackConfig(
        tile_m=tile_m,
        tile_n=tile_n,
        cluster_m=cluster_m,
        cluster_n=cluster_n,
        swap_ab="swap" in flags,
        pingpong="pingpong" in flags,
        is_dynamic_persistent=False,
        device_capacity=9,
    )

    def make(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
        return lambda: gemm_tuned.fn(a, b, out, config=config, split_k=1), spec

    return Peer("quack", make)


def measure(
    shape: dict,
    dtype: str,
    kernels: dict,
    configs: list[GemmConfig],
    peers: tuple[Peer, ...],
    reps: int,
) -> list[dict]:
    m, n, k = shape["m"], shape["n"], shape["k"]
    runs, errors, peer_choices = verified_contenders(shape, dtype, kernels, configs, peers)
    sustained = sustained_rounds(runs, reps)
    peer_at = {peer.name: 1 + len(configs) + j for j, peer in enumerate(peers)}
    rows = []
    for i, config in enumerate(configs):
        fields = sustained_fields(sustained, 1 + i, peer_at)
        row = {
            **kernel_row(shape["name"], m, n, k, dtype, config.key),
            "rel_err": round(errors[1 + i], 6),
            **fields,
            "sustained_tflops": round(tflops(m, n, k, 1, fields["sustained_ms"]), 1),
            "sustained_mcycles": round(fields["sustained_ms"] * fields["sustained_mhz"] / 1e3, 4),
            "reps": [round(ms, 5) for ms, _ in sustained[1 + i]],
        }
        for peer, choice in zip(peers, peer_choices, strict=True):
            row[f"{peer.name}_config"] = choice
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="l8b_gateup_4k")
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--configs", required=True, help="config keys, comma-separated")
    parser.add_argument(
        "--quack", default="tuned", help='"tuned", "none", or a config "TMxTN,CMxCN[,swap]"'
    )
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    shape = next(s for s in load_shapes() if s["name"] == args.shape)
    peers: tuple[Peer, ...] = ()
    if args.quack == "tuned":
        from bench_peers import quack_peer

        peers = (quack_peer(),)
    elif args.quack != "none":
        peers = (quack_fixed_peer(args.quack),)
    dtypes = args.dtypes.split(",")
    configs = [GemmConfig.from_key(key) for key in args.configs.split(",")]
    kernels = compile_configs(configs, dtypes, args.workers)
    rows = []
    for dtype in dtypes:
        dtype_rows = measure(shape, dtype, kernels, configs, peers, args.reps)
        for row in sorted(dtype_rows, key=lambda r: r["sustained_ms"]):
            versus = "".join(f", {row[f'vs_{p.name}_sustained']:.4f} of {p.name}" for p in peers)
            print(
                f"{dtype} {row['config'][5:]:>40} {row['sustained_ms'] * 1e3:8.1f} us "
                f"{row['sustained_mhz']:5d} MHz {row['sustained_mcycles']:.3f} Mcycles: "
                f"{row['sustained_ratio']:.4f} of cuBLAS{versus}",
                flush=True,
            )
        rows += dtype_rows
    method = (
        f"common.sustained_rounds: cuBLAS (torch.mm), each config and "
        f"{'QuACK 0.6.5 (' + args.quack + ')' if peers else 'no peer'} in {args.reps} loops "
        f"of 1 s of back-to-back runs (L2 cleared before each run, the clear's time taken off), "
        f"in turn, every other rep reversed; *_sustained_ms: median ms per run over the loops, "
        f"*_mhz: mean SM clock NVML read during them, sustained_mcycles = ms x MHz / 1e3; "
        f"ratios: the other's ms / ours (above 1: we are faster); inputs torch.randn, A (m,k) "
        f"and B (k,n) row-major, the same tensors for every contender, each verified against a "
        f"float32 reference first (rel. Frobenius error < {TOLERANCE})"
    )
    print(f"wrote {write_results('sustained', method, rows, args.out_dir)}")


if __name__ == "__main__":
    main()
