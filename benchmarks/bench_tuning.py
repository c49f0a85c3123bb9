"""How fast tuning is, and how good its choice is (issue 5).

For every shape of the suite (bf16, A and B row-major): a cold tune with the default top-8
(a fresh kernel folder: everything is compiled), reporting its wall time, the compile time
summed over the pool's workers and the benchmark time. The reference for `top_k_vs_exhaustive`
is the exhaustive search of `collect_timings.py` (every binary, every split count, the best
binaries at every raster and swizzle): its three best configs and the top-8 tune's choice are
timed again here, side by side, run by run in turn (100 runs, 25 ms warm-up, L2 flushed before
each run) on the same inputs.

    python benchmarks/bench_tuning.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, load_shapes, write_results

from gemmtune.core.config import GemmConfig
from gemmtune.core.problem import GemmProblem
from gemmtune.tuning.tuner import tune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--shapes", default="")
    parser.add_argument(
        "--exhaustive",
        type=Path,
        default=RESULTS / "timings-h200-2026-11-22.json.gz",
        help="collect_timings.py output",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with gzip.open(args.exhaustive) as f:
        exhaustive = defaultdict(list)
        for r in json.load(f)["rows"]:
            if r["ours_ms"] is not None:
                exhaustive[r["shape"]].append((r["ours_ms"], r["config"]))
    shared = Path(tempfile.mkdtemp(prefix="gemmtune-exhaustive-"))
    rows = []
    for shape in load_shapes():
        if args.shapes and shape["name"] not in args.shapes.split(","):
            continue
        m, n, k = shape["m"], shape["n"], shape["k"]
        a = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(k, n, device="cuda", dtype=torch.bfloat16)
        problem = GemmProblem.from_tensors(a, b)
        with tempfile.TemporaryDirectory(prefix="gemmtune-cold-") as cold:
            top = tune(problem, top_k=args.top_k, kernel_dir=Path(cold), progress=False)
        row = {
            "shape": shape["name"],
            "m": m,
            "n": n,
            "k": k,
            "dtype": "bf16",
            "top_k": args.top_k,
            "candidates": top.candidates,
            "timed": len(top.results),
            "compiled": top.compiled,
            "tune_wall_s": round(top.wall_s, 2),
            "compile_s": round(top.compile_s, 2),
            "bench_s": round(top.bench_s, 2),
            "best_ms": round(top.best_ms, 5),
            "config": top.best.key,
            "failures": len(top.failures),
        }
        leaders = [GemmConfig.from_key(c) for _, c in sorted(exhaustive[shape["name"]])[:3]]
        # the exhaustive leaders and the top-k choice, decided side by side
        pool = list(dict.fromkeys([top.best, *leaders]))
        both = tune(
            problem, configs=pool, sweep=0, finalists=len(pool), kernel_dir=shared, progress=False
        )
        final = {r.config: r.final_ms for r in both.results if r.final_ms is not None}
        exhaustive_ms = min(final[c] for c in leaders if c in final)
        row.update(
            exhaustive_timed=len(exhaustive[shape["name"]]),
            exhaustive_best_ms=round(exhaustive_ms, 5),
            exhaustive_config=min((final[c], c.key) for c in leaders if c in final)[1],
            top_k_ms_side_by_side=round(final[top.best], 5),
            top_k_vs_exhaustive=round(exhaustive_ms / final[top.best], 4),
        )
        rows.append(row)
        print(
            f"{shape['name']:>20}: tune {row['tune_wall_s']:5.1f} s (compile {row['compile_s']:.1f}"
            f" s summed, bench {row['bench_s']:.1f} s), top-{args.top_k} "
            f"{row['top_k_vs_exhaustive']:.3f} of exhaustive",
            flush=True,
        )
        path = write_results(
            "tuning", __doc__.split("\n\n")[1].replace("\n", " "), rows, args.out_dir
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
