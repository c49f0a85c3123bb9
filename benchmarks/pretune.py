"""Pretuning a model's buckets on one GPU and on several: wall time and speedup.

Per GPU count (1, then every GPU of `--gpus`), one `gemmtune pretune --model-config ... --json`
in a new process with an empty cache folder (nothing compiled or tuned before): projections of a
Llama-3 8B layer (`--projections`, by default o and qkv) at the batch sizes given (by default
1-128: 16 decode buckets; the whole layer at 1, 16, 256 and 4096 rows is another 16, from
decode to prefill). Rows: `buckets`, `gpus`, `wall_s` (the command's, from start to exit:
imports, workers, tuning, the records' exchange), `s_per_bucket`, `speedup_vs_1gpu` (one GPU's
wall time over this one's), `projections`, `batch_sizes`.

    python -m benchmarks pretune --out-dir DIR [--gpus 0,1] [--projections qkv o gate_up down]
        [--batch-sizes 1 2 4 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, write_results

SUITE_HELP = "pretune a model's buckets on one GPU and on several: wall time, speedup"

#: a Llama-3 8B layer's projections: x @ w.t() with w of n rows and k columns
LLAMA3_8B = {
    "qkv": {"n": 6144, "k": 4096},
    "o": {"n": 4096, "k": 4096},
    "gate_up": {"n": 28672, "k": 4096},
    "down": {"n": 4096, "k": 14336},
}


def pretune_run(gpus: list[int], batch_sizes: list[int], model_file: Path) -> tuple[float, dict]:
    """(wall seconds, the command's JSON report) of one pretune on an empty cache."""
    with tempfile.TemporaryDirectory(prefix="gemmtune-pretune-bench-") as cache:
        env = dict(os.environ, GEMMTUNE_CACHE_DIR=cache)
        command = [
            sys.executable, "-m", "gemmtune", "pretune", "--model-config", str(model_file),
            "--batch-sizes", *map(str, batch_sizes), "--gpus", ",".join(map(str, gpus)), "--json",
        ]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"pretune on {gpus} failed: {done.stderr[-3000:]}")
    return wall, json.loads(done.stdout)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks pretune", description=SUITE_HELP)
    parser.add_argument("--gpus", default="0,1", help="the GPUs of the several-GPU run")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--projections", nargs="+", choices=sorted(LLAMA3_8B), default=["o", "qkv"])
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    gpus = [int(g) for g in args.gpus.split(",")]
    model = {"linears": [{"name": name, **LLAMA3_8B[name]} for name in args.projections]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(model, f)
    model_file = Path(f.name)
    rows, one_gpu_s = [], None
    for run_gpus in ([gpus[0]], gpus):
        wall, report = pretune_run(run_gpus, args.batch_sizes, model_file)
        buckets = len(report["rows"])
        one_gpu_s = one_gpu_s or wall
        row = {
            "what": "pretune",
            "buckets": buckets,
            "gpus": len(run_gpus),
            "wall_s": round(wall, 2),
            "s_per_bucket": round(wall / buckets, 3),
            "speedup_vs_1gpu": round(one_gpu_s / wall, 3),
            "tuned_all": all(r["config"] for r in report["rows"]),
            "projections": args.projections,
            "batch_sizes": args.batch_sizes,
        }
        print(row, flush=True)
        rows.append(row)
    model_file.unlink()
    method = (
        f"gemmtune pretune --model-config (Llama-3 8B {', '.join(args.projections)}, x @ w.t(), "
        f"bf16) --batch-sizes {args.batch_sizes} --gpus, a new process and an empty cache folder "
        "per run; wall time of the command"
    )
    return write_results("pretune", method, rows, args.out_dir)
