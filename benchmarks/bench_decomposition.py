"""Data-parallel, split-K and stream-K against cuBLAS (issue 4).

Two parts, each timed side by side with cuBLAS (`torch.mm`) on the same `torch.randn` tensors,
run by run in turn, L2 flushed before each run, median of `--runs`:
- the wave-quantization sweep: M=1024, K=4096, N stepping by one tile width (128) over three
  waves of 128x128 tiles; one tile config under each decomposition (split-K at its best split
  count of a few);
- the heuristic: for every shape of the suite, the decomposition `suggest_decomposition`
  picks for the best data-parallel tile, against that tile data-parallel.
Results go to `decomposition-<gpu>-<date>.json` and a PNG plot of the sweep.

    python benchmarks/bench_decomposition.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    RESULTS,
    TOLERANCE,
    against_cublas,
    compile_and_load,
    kernel_row,
    load_shapes,
    write_results,
)

from gemmtune.core.config import GemmConfig
from gemmtune.core.device import max_active_clusters
from gemmtune.kernels.launch import launch_args
from gemmtune.kernels.schedule_model import TileGrid, ceil_div, suggest_decomposition
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules
from gemmtune.measure.timing import L2Flusher, time_side_by_side
from gemmtune.measure.verify import relative_error
from gemmtune.workers.compiler import CompileJob

SWEEP_TILE = GemmConfig(tile_m=128, tile_n=128, cluster_m=2)
SWEEP_SPLITS = (2, 3, 4)
# the best data-parallel tile per suite shape, from kernel-h200-2026-11-21.json
SUITE_TILES = {
    "sq2048": GemmConfig(tile_m=256, tile_n=128, cluster_n=2),
    "sq4096": GemmConfig(tile_m=128, tile_n=256, cluster_m=2),
    "sq8192": GemmConfig(tile_m=128, tile_n=256, cluster_m=2),
    "l8b_qkv_4k": GemmConfig(tile_m=256, tile_n=192, cluster_m=2),
    "l8b_o_4k": GemmConfig(tile_m=256, tile_n=128, cluster_n=2),
    "l8b_gateup_4k": GemmConfig(tile_m=128, tile_n=192, schedule="pingpong", cluster_m=2),
    "l8b_down_4k": GemmConfig(tile_m=128, tile_n=256),
    "l8b_qkv_128": GemmConfig(tile_m=64, tile_n=128, schedule="pingpong"),
    "l8b_down_128": GemmConfig(tile_m=64, tile_n=128, schedule="pingpong"),
    "wave_1k_4352": GemmConfig(tile_m=128, tile_n=160, schedule="pingpong", cluster_m=2),
    "wave_2k_2304": GemmConfig(tile_m=192, tile_n=192),  # run 4 of that file
    "smallmn_512_32k": GemmConfig(tile_m=64, tile_n=128, schedule="pingpong"),
    "smallmn_256_1k_64k": GemmConfig(tile_m=64, tile_n=128, schedule="pingpong"),
}
DECOMPOSITIONS = ("data_parallel", "split_k", "stream_k")
log = logging.getLogger("bench_decomposition")


def variants(config: GemmConfig) -> list[GemmConfig]:
    """The tile under each decomposition the kernel implements for it (data-parallel first)."""
    every = [
        GemmConfig.from_dict(
            {**config.to_dict(), "decomposition": d, "splits": 2 if d == "split_k" else 1}
        )
        for d in DECOMPOSITIONS
    ]
    return [c for c in every if rules.implements(c) is None]


def compile_kernels(configs: list[GemmConfig]) -> dict:
    jobs = sorted({CompileJob(c, KernelSignature()) for c in configs}, key=lambda j: j.name)
    kernels, failed = compile_and_load(jobs, workers=15)
    if failed:
        raise RuntimeError(f"{failed[0].job.name}: {failed[0].error}")
    return kernels


class Problem:
    """One shape's tensors and the launchers of our configs and of cuBLAS on them."""

    def __init__(self, m: int, n: int, k: int, kernels: dict):
        torch.manual_seed(0)
        self.m, self.n, self.k = m, n, k
        self.a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        self.out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        self.ref = torch.matmul(self.a.float(), self.b.float())
        self.kernels = kernels

    def launcher(self, config: GemmConfig):
        kernel = self.kernels[(config.compile_key, "bf16")]
        args = launch_args(config, self.a.device, self.m, self.n, self.k, 1)
        return lambda: kernel(self.a, self.b, self.out, *args)

    def check(self, config: GemmConfig) -> float:
        self.out.fill_(float("nan"))
        self.launcher(config)()
        err = relative_error(self.out, self.ref)
        if not err < TOLERANCE:
            raise AssertionError(f"{config.key} on {self.m}x{self.n}x{self.k}: rel err {err}")
        return err

    def cublas(self):
        return lambda: torch.mm(self.a, self.b, out=self.out)

    def time(self, configs: list[GemmConfig], flush, runs: int) -> tuple[float, list[float]]:
        """cuBLAS's median and each config's, side by side."""
        for config in configs:
            self.check(config)
        timings = time_side_by_side(
            [self.cublas()] + [self.launcher(c) for c in configs], runs=runs, flush=flush
        )
        return timings[0].median_ms, [t.median_ms for t in timings[1:]]


def sweep(kernels: dict, flush, runs: int) -> list[dict]:
    rows = []
    resident = max_active_clusters(SWEEP_TILE.cluster_m * SWEEP_TILE.cluster_n, 0)
    tiles_m = 1024 // SWEEP_TILE.tile_m
    waves = 3 * resident * SWEEP_TILE.cluster_m // tiles_m  # N-tiles in three waves
    dp, sk, st = variants(SWEEP_TILE)
    for n_tiles in range(1, waves + 1):
        n = n_tiles * SWEEP_TILE.tile_n
        problem = Problem(1024, n, 4096, kernels)
        splits = [sk.with_runtime(splits=s) for s in SWEEP_SPLITS]
        cublas_ms, times = problem.time([dp, st, *splits], flush, runs)
        best_split = min(range(len(splits)), key=lambda i: times[2 + i])
        row = {
            "shape": "custom",
            "m": 1024,
            "n": n,
            "k": 4096,
            "l": 1,
            "dtype": "bf16",
            "layout": "tn",
            "units": TileGrid(1024, n, 1, 128, 128, SWEEP_TILE.cluster_m).work_units,
            "cublas_ms": round(cublas_ms, 5),
            "data_parallel_ms": round(times[0], 5),
            "stream_k_ms": round(times[1], 5),
            "split_k_ms": round(times[2 + best_split], 5),
            "split_k_config": splits[best_split].key,
        }
        for name in ("data_parallel", "stream_k", "split_k"):
            row[f"{name}_ratio"] = round(cublas_ms / row[f"{name}_ms"], 4)
        rows.append(row)
        print(
            f"sweep n={n:5d} units={row['units']:4d} cuBLAS {cublas_ms * 1e3:7.1f} us  "
            + "  ".join(f"{d} {row[f'{d}_ratio']:.3f}" for d in DECOMPOSITIONS),
            flush=True,
        )
    return rows


def heuristic(kernels: dict, flush, runs: int) -> list[dict]:
    rows = []
    for shape in load_shapes():
        config = SUITE_TILES[shape["name"]]
        m, n, k = shape["m"], shape["n"], shape["k"]
        grid = TileGrid.of(config, m, n, 1)
        resident = max_active_clusters(config.cluster_m * config.cluster_n, 0)
        choice, splits = suggest_decomposition(grid, ceil_div(k, 64), resident)
        dp = variants(config)[0]
        chosen = GemmConfig.from_dict(
            {**config.to_dict(), "decomposition": choice, "splits": splits}
        )
        if rules.implements(chosen) is not None:
            raise RuntimeError(f"{shape['name']}: {rules.implements(chosen)}")
        problem = Problem(m, n, k, kernels)
        cublas_ms, (dp_ms, chosen_ms) = problem.time([dp, chosen], flush, runs)
        rows.append(
            {
                **kernel_row(shape["name"], m, n, k, "bf16", chosen.key),
                "decomposition": choice,
                **against_cublas(m, n, k, chosen_ms, cublas_ms),
                "data_parallel_ms": round(dp_ms, 5),
                "vs_data_parallel": round(dp_ms / chosen_ms, 4),
            }
        )
        print(
            f"heuristic {shape['name']:>20}: {choice:>13} {rows[-1]['vs_data_parallel']:.3f}x "
            f"data-parallel, {rows[-1]['ratio']:.3f}x cuBLAS",
            flush=True,
        )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    n = [r["n"] for r in rows]
    for name, style in (("data_parallel", "-"), ("split_k", "--"), ("stream_k", "-.")):
        ax.plot(n, [r[f"{name}_ratio"] for r in rows], style, label=name.replace("_", "-"))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("N (M = 1024, K = 4096, bf16; 128x128 tiles, cluster 2x1)")
    ax.set_ylabel("speed relative to cuBLAS")
    ax.set_title("Wave quantization: three waves of tiles, one tile width per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--parts", default="sweep,heuristic")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    configs = variants(SWEEP_TILE) + [v for c in SUITE_TILES.values() for v in variants(c)]
    kernels = compile_kernels(configs)
    flush = L2Flusher()
    rows = []
    if "sweep" in args.parts:
        sweep_rows = sweep(kernels, flush, args.runs)
        plot(sweep_rows, args.out_dir / "wave-sweep.png")
        rows += [{"part": "wave_sweep", **r} for r in sweep_rows]
    if "heuristic" in args.parts:
        rows += [{"part": "heuristic", **r} for r in heuristic(kernels, flush, args.runs)]
    method = (
        f"CUDA events, 25 ms warm-up, L2 flushed before each run, median of {args.runs} runs, "
        "cuBLAS (torch.mm) and our variants timed side by side run by run in turn; "
        "torch.randn bf16 inputs, A (m,k) and B (k,n) row-major; every variant checked against "
        "a float32 reference first"
    )
    print(f"wrote {write_results('decomposition', method, rows, args.out_dir)}")


if __name__ == "__main__":
    main()
