"""The serving suite: our kernels (and tuned_gemm) against cuBLAS where LLM serving spends its
GEMM time, with the memory bandwidth each reaches.

The suite ships with gemmtune (`src/gemmtune/measure/serving.json`, `gemmtune bench --suite
serving`): decode batches of 1-128 tokens through the qkv, o, gate-up and down projections of
a Llama-3 8B and 70B layer at their real N and K, ragged prefill and mid-size problems that
are no tile multiples, and small outputs over long K; each shape says where it comes from.
Per dtype, layout and contender, one run of `gemmtune bench --json --suite serving` in a new
process with an empty cache folder (`benchmarks.public.bench_run`): contender "kernels" tunes
our kernels alone (`GEMMTUNE_CUBLAS=0`), "tuned_gemm" with cuBLAS among the candidates. Rows
are kernel rows with `suite`, `gbps` and `bw_fraction` (of the GPU's memory bandwidth,
measured in the same run: `gemmtune.measure.bandwidth`).

    python -m benchmarks serving --out-dir DIR [--dtype bf16 fp16] [--layout nk kn]
        [--contenders kernels tuned_gemm] [--only decode,l8b_down,ragged_800x1200x4096,...]
        [--time-limit SECONDS]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, suite_file_name, write_results
from benchmarks.public import (
    BIAS_HELP,
    CONTENDERS,
    TIME_LIMIT_HELP,
    TimeShare,
    bench_run,
    describe,
    input_kind,
)
from gemmtune.cli.bench import B_LAYOUTS, load_shape_suite
from gemmtune.core.dtypes import KERNEL_INPUTS, SCALINGS

SUITE_HELP = "the serving suite (decode, ragged, small-MN): our kernels and tuned_gemm vs cuBLAS"


def selected(only: str) -> list[dict]:
    """The serving shapes `only` names, comma-separated (empty: all): a kind ("decode",
    "ragged", "small-mn"), a shape's name, or the start of names up to an underscore
    ("l8b_down" is every l8b_down_m*)."""
    shapes = load_shape_suite(suite="serving")
    wanted = [w for w in only.split(",") if w]

    def chosen(shape: dict) -> bool:
        name = shape["name"]
        return any(w in (shape["kind"], name) or name.startswith(w + "_") for w in wanted)

    picked = [s for s in shapes if not wanted or chosen(s)]
    if not picked:
        raise SystemExit(f"no serving shape is {wanted}")
    return picked


def summary(rows: list[dict]) -> list[str]:
    """Per contender, dtype and layout: the geometric mean ratio, the worst shape, the least
    bandwidth fraction of the memory-bound rows (M <= 64), and how many rows torch refused
    (timed ours alone: `torch_error`)."""
    lines = []
    groups = sorted({(r["contender"], r.get("dtype"), r.get("layout") or "") for r in rows})
    for contender, dtype, layout in groups:
        group = [
            r
            for r in rows
            if (r["contender"], r.get("dtype"), r.get("layout") or "") == (contender, dtype, layout)
            and "ratio" in r
        ]
        if not group:
            continue
        geomean = math.exp(sum(math.log(r["ratio"]) for r in group) / len(group))
        worst = min(group, key=lambda r: r["ratio"])
        bound = [r for r in group if r["m"] <= 64 and "bw_fraction" in r]
        least = min(bound, key=lambda r: r["bw_fraction"]) if bound else None
        line = (
            f"{contender} {dtype} {layout}: geometric mean {geomean:.3f} over {len(group)}, "
            f"worst {worst['shape']} {worst['ratio']:.3f}"
        )
        if least is not None:
            line += f"; memory-bound rows: least {least['bw_fraction']:.2f} of bandwidth"
        refused = sum(
            (r["contender"], r.get("dtype"), r.get("layout") or "") == (contender, dtype, layout)
            and "torch_error" in r
            for r in rows
        )
        if refused:
            line += f"; {refused} rows torch refuses, ours timed alone"
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks serving", description=SUITE_HELP)
    parser.add_argument("--dtype", nargs="+", default=["bf16"], choices=KERNEL_INPUTS)
    parser.add_argument("--layout", nargs="+", default=["nk"], choices=list(B_LAYOUTS))
    parser.add_argument("--contenders", nargs="+", default=["kernels"], choices=list(CONTENDERS))
    parser.add_argument(
        "--only", default="", help="comma-separated kinds, shape names or name stems (l8b_down)"
    )
    parser.add_argument("--scaling", default="tensor", choices=list(SCALINGS))
    parser.add_argument("--accumulation", default="fast", choices=["fast", "promoted"])
    parser.add_argument("--bias", action="store_true", help=BIAS_HELP)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--time-limit", type=float, metavar="SECONDS", help=TIME_LIMIT_HELP)
    args = parser.parse_args(argv)
    shapes = selected(args.only)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"shapes": shapes}, f)
    suite_file = Path(f.name)
    rows, methods = [], set()
    share = TimeShare(args.time_limit, len(args.dtype) * len(args.layout) * len(args.contenders))
    for dtype in args.dtype:
        for layout in args.layout:
            for contender in args.contenders:
                document = bench_run(
                    dtype,
                    CONTENDERS[contender],
                    suite_file,
                    layout=layout,
                    scaling=args.scaling,
                    accumulation=args.accumulation,
                    bias=args.bias,
                    time_limit=share.next_run(),
                )
                methods.add(document["method"].rsplit(";", 1)[0])
                for row in document["rows"]:
                    row.setdefault("dtype", dtype)
                    row.update(contender=contender, suite="serving")
                    print(describe(row), flush=True)
                rows += document["rows"]
    suite_file.unlink()
    if not any("ratio" in row for row in rows):
        if not rows:
            raise SystemExit("no shape was timed: the time limit left none")
        raise SystemExit(f"every shape failed, e.g. {rows[0].get('error')}")
    for line in summary(rows):
        print(line)
    method = (
        f"serving suite ({len(shapes)} shapes), per dtype ({', '.join(args.dtype)}), b layout "
        f"({', '.join(args.layout)}) and contender ({', '.join(args.contenders)}) a new process "
        f"with an empty cache folder; each run: {' | '.join(sorted(methods))}; "
        f"{input_kind(args.dtype, args.scaling, args.accumulation, args.bias)}"
    )
    name = suite_file_name("serving", args.dtype, args.scaling, args.accumulation, args.bias)
    return write_results("kernel", method, rows, args.out_dir, name=name)
