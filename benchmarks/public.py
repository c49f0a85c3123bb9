"""The public shape suite: tuned_gemm, and our kernels alone, against cuBLAS on the same tensors.

Per dtype, two runs of `gemmtune bench --json` (the product's own benchmark,
`gemmtune.cli.bench.compare_with_cublas`: per shape, one tuned_gemm call, which tunes the
shape's bucket, a check against a float32 reference, then tuned_gemm and torch.matmul on the
same `torch.randn` tensors, each alone in windows taken in turn, cold L2). Each run is a new
process with an empty cache folder, so the two never share a tuning record: one with cuBLAS
among the tuning's candidates (`"contender": "tuned_gemm"`), one without (`GEMMTUNE_CUBLAS=0`,
`"contender": "kernels"`: our kernels alone). Rows are kernel rows; ratio = cublas_ms /
ours_ms, above 1: gemmtune is faster.

    python -m benchmarks public --out-dir DIR [--dtype bf16 fp16 int8] [--layout kn|nk]
        [--shapes FILE] [--contenders kernels] [--time-limit SECONDS]

`--time-limit` bounds the whole suite: each run is given an equal share of the time left
(`TimeShare`), starts no shape past it (`gemmtune bench --time-limit`), and the file keeps the
rows measured, its method saying where a run stopped.

8-bit MMAs read both operands K-major: int8 and fp8 (e4m3, e5m2) with `--layout nk`
(`x @ w.t()`) run on our kernels as they are, int8 with `--layout kn` on a K-major copy of b
made on every call (fp8 takes nk only: torch._scaled_mm refuses a row-major b). int8's
contender is torch._int_mm on the operands as given, and its inputs are uniform
over the 256 values; fp8's is torch._scaled_mm with fast accumulation and a bf16 output, scaled
per tensor or per row and column (`--scaling`), against gemmtune.scaled_mm.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import RESULTS, suite_file_name, write_results
from gemmtune.api.choice import CUBLAS_ENV
from gemmtune.cli.bench import B_LAYOUTS, load_shape_suite
from gemmtune.core.dtypes import FP8, KERNEL_INPUTS, SCALINGS

SUITE_HELP = "the public shape suite: tuned_gemm and our kernels alone against cuBLAS"

#: contender -> the value of GEMMTUNE_CUBLAS its tuning runs with
CONTENDERS = {"tuned_gemm": "1", "kernels": "0"}


class TimeShare:
    """A suite's time limit shared by its runs: each run, as it starts, is given an equal part
    of the time left (None where the suite has no limit)."""

    def __init__(self, limit: float | None, runs: int, clock: Callable[[], float] = time.monotonic):
        self.limit, self.runs_left, self.clock = limit, runs, clock
        self.started = clock()

    def next_run(self) -> float | None:
        """The seconds the next run may take."""
        if self.limit is None:
            return None
        left = max(self.limit - (self.clock() - self.started), 0.0)
        share = left / max(self.runs_left, 1)
        self.runs_left -= 1
        return share


def bench_run(
    dtype: str,
    cublas: str,
    shapes: Path | None,
    suite: str = "public",
    layout: str = "kn",
    scaling: str = "tensor",
    accumulation: str = "fast",
    bias: bool = False,
    time_limit: float | None = None,
) -> dict:
    """The results document of one `gemmtune bench --json` run, in a new process on an empty
    cache folder, with GEMMTUNE_CUBLAS=`cublas`: the suite `suite`, or the file `shapes`
    (`scaling` and `accumulation`: an fp8 product's; `bias`: both contenders add one;
    `time_limit`: seconds after which it starts no shape)."""
    command = [sys.executable, "-m", "gemmtune", "bench", "--json", "--dtype", dtype]
    command += ["--layout", layout, "--scaling", scaling, "--accumulation", accumulation]
    command += ["--bias"] if bias else []
    command += ["--time-limit", f"{time_limit:.1f}"] if time_limit is not None else []
    command += ["--shapes", str(shapes)] if shapes is not None else ["--suite", suite]
    with tempfile.TemporaryDirectory(prefix="gemmtune-public-") as cache:
        env = {**os.environ, "GEMMTUNE_CACHE_DIR": cache, CUBLAS_ENV: cublas}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if not done.stdout.strip():
        raise SystemExit(f"gemmtune bench printed no results:\n{done.stderr[-3000:]}")
    if done.returncode:  # a shape failed or computed a wrong result: its row says which
        print(done.stderr[-2000:], file=sys.stderr)
    return json.loads(done.stdout)


def describe(row: dict) -> str:
    """One line of progress for a row."""
    head = f"{row['contender']:>10} {row.get('dtype', '')} {row.get('shape', '?'):>20}"
    if "error" in row:
        return f"{head}: {row['error']}"
    wrong = "" if row.get("correct", True) else "  WRONG RESULT"
    bandwidth = f"  {row['bw_fraction']:.2f} of bw" if "bw_fraction" in row else ""
    if "ratio" in row:
        ratio = f"ratio {row['ratio']:.3f}{bandwidth}"
    else:  # torch refused the call (`torch_error`): ours alone
        ratio = f"{row['ours_ms'] * 1e3:.1f} µs{bandwidth}, torch refuses it"
    return f"{head} {row.get('layout', '')}: {ratio}  {row['config']}{wrong}"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks public", description=SUITE_HELP)
    parser.add_argument("--dtype", nargs="+", default=["bf16"], choices=KERNEL_INPUTS)
    parser.add_argument(
        "--shapes", type=Path, metavar="FILE", help="a shape suite (default: gemmtune's own)"
    )
    parser.add_argument(
        "--layout", default="kn", choices=list(B_LAYOUTS), help="b as x @ w (kn) or x @ w.t() (nk)"
    )
    parser.add_argument("--scaling", default="tensor", choices=list(SCALINGS))
    parser.add_argument("--accumulation", default="fast", choices=["fast", "promoted"])
    parser.add_argument("--bias", action="store_true", help=BIAS_HELP)
    parser.add_argument(
        "--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS)
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--time-limit", type=float, metavar="SECONDS", help=TIME_LIMIT_HELP)
    args = parser.parse_args(argv)
    shapes = load_shape_suite(args.shapes)  # read here too: a bad file fails before any run
    print(f"{len(shapes)} shapes, {' '.join(args.dtype)}, contenders {', '.join(args.contenders)}")
    rows, methods = [], set()
    share = TimeShare(args.time_limit, len(args.dtype) * len(args.contenders))
    for dtype in args.dtype:
        for contender in args.contenders:
            document = bench_run(
                dtype,
                CONTENDERS[contender],
                args.shapes,
                layout=args.layout,
                scaling=args.scaling,
                accumulation=args.accumulation,
                bias=args.bias,
                time_limit=share.next_run(),
            )
            # the bench's method names the dtype; the dtypes are listed once below
            methods.add(document["method"].rsplit(";", 1)[0])
            for row in document["rows"]:
                row.setdefault("dtype", dtype)  # error rows carry only the shape
                row["contender"] = contender
                print(describe(row), flush=True)
            rows += document["rows"]
    if not any("ratio" in row for row in rows):  # a broken setup, not a measurement
        if not rows:
            raise SystemExit("no shape was timed: the time limit left none")
        raise SystemExit(f"every shape failed, e.g. {rows[0].get('error')}")
    for contender in args.contenders:
        ratios = [r["ratio"] for r in rows if r["contender"] == contender and "ratio" in r]
        if ratios:
            geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"{contender}: geometric mean ratio {geomean:.3f} over {len(ratios)} rows")
    described = {
        "tuned_gemm": f"contender tuned_gemm ({CUBLAS_ENV}=1, cuBLAS among the candidates)",
        "kernels": f"contender kernels ({CUBLAS_ENV}=0, our kernels alone)",
    }
    method = (
        f"per dtype ({', '.join(args.dtype)}) a run per contender, each a new process with an "
        f"empty cache folder: {' and '.join(described[c] for c in args.contenders)}; each run: "
        f"{' | '.join(sorted(methods))}; "
        f"{input_kind(args.dtype, args.scaling, args.accumulation, args.bias)}"
    )
    name = suite_file_name("public", args.dtype, args.scaling, args.accumulation, args.bias)
    return write_results("kernel", method, rows, args.out_dir, name=name)


#: what `--time-limit` does to a suite
TIME_LIMIT_HELP = (
    "the whole suite's time: each run gets an equal share of what is left and starts no shape "
    "past it; the file keeps the rows measured"
)
#: what `--bias` asks of both contenders
BIAS_HELP = (
    "both contenders add a bias, one element per output column in the output's type (16-bit: "
    "tuned_gemm's against torch.addmm; fp8: scaled_mm's against torch._scaled_mm's)"
)


def input_kind(
    dtypes: list[str], scaling: str = "tensor", accumulation: str = "fast", bias: bool = False
) -> str:
    """How the suite's inputs were drawn, for a results file's method."""
    kinds = ["torch.randn inputs" for d in dtypes if d != "int8"][:1]
    if bias and set(dtypes) - set(FP8) - {"int8"}:
        kinds.append(
            "16-bit: a bias per column in the output's type (torch.randn times the square root "
            "of K); ours tuned_gemm(a, b, bias=bias), contender torch.addmm(bias, a, b)"
        )
    if set(dtypes) & set(FP8):
        biased = ", a bf16 bias per column (torch.randn times the square root of K)" * bias
        kinds.append(
            f"fp8 inputs torch.randn rounded to fp8, scales uniform in [0.5, 1.5) per {scaling}, "
            f"bf16 output{biased}; ours gemmtune.scaled_mm, contender torch._scaled_mm, both with "
            f"use_fast_accum={accumulation == 'fast'}"
        )
    if "int8" in dtypes:
        kinds.append(
            "int8 inputs uniform over [-128, 127], torch._int_mm as the contender (on copies "
            "zero-padded to the sizes it takes where needed: m > 16, k and n multiples of 8)"
        )
    return ", ".join(kinds)


if __name__ == "__main__":
    print(main())
