"""The `gemmtune` command.

gemmtune doctor                     what this machine offers gemmtune
gemmtune tune --shape MxNxK[xL]     tune one problem now and store the winner
gemmtune pretune --model-config F   tune a model's GEMMs ahead of time (--gpus 0,1: on several)
gemmtune show                       the cached tuning results
gemmtune clear [--kernels]          forget them (and the compiled kernels)
gemmtune bench                      a shape suite (public, serving) against cuBLAS
gemmtune cache show|clear|export|import
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from gemmtune.cli import bench, doctor, pretune, results, tune
from gemmtune.core.config import GemmConfig, InvalidConfigError
from gemmtune.core.dtypes import KERNEL_INPUTS, KERNEL_OUTPUTS, SCALINGS
from gemmtune.core.settings import MODES

LAYOUTS = ("tn", "nn", "nt", "tt")

_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)(?:x(\d+))?", re.IGNORECASE)


# -- helpers ------------------------------------------------------------------------------------


def parse_shape(text: str) -> tuple[int, int, int, int | None]:
    """`MxNxK` or `MxNxKxL` -> (m, n, k, l), l None for a 2-D problem (argparse type)."""
    match = _SHAPE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not MxNxK or MxNxKxL (e.g. 4096x4096x4096, or 64x1024x1024x8)"
        )
    m, n, k, l = (int(g) if g is not None else None for g in match.groups())
    if min(v for v in (m, n, k, l) if v is not None) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be at least 1")
    return m, n, k, l


def parse_configs(text: str) -> list[GemmConfig]:
    """`--configs`: comma-separated config keys, each a `GemmConfig` as its key names it."""
    keys = [key.strip() for key in text.split(",") if key.strip()]
    if not keys:
        raise argparse.ArgumentTypeError("name at least one config key")
    try:
        return [GemmConfig.from_key(key) for key in keys]
    except InvalidConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tune(args: argparse.Namespace) -> int:
    """`gemmtune tune`: one --shape, or the many GEMMs of --shapes/--model-config (a pretune
    on this GPU)."""
    if args.shape is None:
        args.gpus = None
        return pretune.run(args)
    return tune.run(args)


# -- doctor -------------------------------------------------------------------------------------


def _doctor(args: argparse.Namespace) -> int:
    targets = doctor.COMPILE_TARGETS if args.compile else ()
    report = doctor.report(compile_targets=targets)
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 0 if all(c["ok"] for c in report["compile"]) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gemmtune",
        description="Autotuned CuTe DSL GEMM kernels for Hopper and Blackwell.",
        epilog="`gemmtune COMMAND --help` describes a command. "
        "The cache lives in $GEMMTUNE_CACHE_DIR (default ~/.cache/gemmtune).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "doctor",
        help="show what this machine offers gemmtune",
        description="Report the GPU, the CUDA and CuTe DSL versions and the cache directory.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also compile a small kernel for sm_90a and sm_100a (no GPU needed)",
    )
    p.set_defaults(run=_doctor)

    p = commands.add_parser(
        "tune",
        help="tune one GEMM shape now and store the winner",
        description="Tune out = a @ b for one shape on this GPU (whatever the cache holds), "
        "store the winner for the shape's bucket, and show every candidate's time. Needs a "
        "CUDA GPU.",
    )
    p.add_argument(
        "--shape",
        type=parse_shape,
        metavar="MxNxK[xL]",
        help="the problem: out[m,n] = a[m,k] @ b[k,n]; xL makes it a batch of L products",
    )
    pretune.add_arguments(p, gpus=False)
    p.add_argument("--dtype", choices=KERNEL_INPUTS, default="bf16", help="a's and b's dtype")
    p.add_argument(
        "--out-dtype", choices=KERNEL_OUTPUTS, help="the output's dtype (default: --dtype)"
    )
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="tn",
        help="A then B, t = K-major (row-major a @ b is tn, the default)",
    )
    p.add_argument(
        "--out-major",
        choices=("n", "m"),
        default="n",
        help="the output's contiguous dimension: n (row-major, default) or m",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=8,
        metavar="K",
        help="compile and time the ranking model's K best configs (default 8)",
    )
    p.add_argument(
        "--bias",
        action="store_true",
        help="plus a bias per output column, in the output's dtype (tuned_gemm's bias=, a "
        "linear layer's): its own bucket, timed against torch.addmm",
    )
    p.add_argument(
        "--exhaustive", action="store_true", help="time every valid config (slow), not the top K"
    )
    p.add_argument(
        "--configs",
        type=parse_configs,
        metavar="KEY[,KEY...]",
        help="time exactly these configs (keys as `tune` and `show` print them), every one in "
        "the final beside torch.matmul, in place of the ranking model's top K",
    )
    p.add_argument(
        "--no-cublas",
        action="store_true",
        help="leave torch.matmul (cuBLAS) out of the final, so a gemmtune kernel always wins",
    )
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    p.set_defaults(run=_tune)

    p = commands.add_parser(
        "pretune",
        help="tune a model's GEMMs (or a file of shapes) ahead of time, on one GPU or several",
        description="Tune every GEMM a model config's layers meet at the batch sizes (and the "
        "problems of a shapes file) that the cache lacks, and store the winners; with --gpus "
        "a thread per GPU takes buckets in turn, each timing on its own GPU. Under torchrun, "
        "`gemmtune.pretune` in the job shares the work across its ranks, and every rank "
        "stores the same table.",
    )
    pretune.add_arguments(p, gpus=True)
    p.add_argument("--dtype", choices=KERNEL_INPUTS, default="bf16", help="a's and b's dtype")
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="tt",
        help="a --shapes problem's A then B, t = K-major (default tt: x @ w.t())",
    )
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(run=pretune.run)

    p = commands.add_parser(
        "show",
        help="show the cached tuning results",
        description="List the tuning results cache: bucket, kernel signature, GPU, the shape "
        "tuned, the winning config (or cublas), its time and when it was tuned.",
    )
    p.add_argument("--json", action="store_true", help="print the results as a JSON list")
    p.set_defaults(run=results.show)

    p = commands.add_parser(
        "clear",
        help="forget every tuning result",
        description="Forget every cached tuning result (the next tuned_gemm call in mode tune "
        "tunes again); --kernels also deletes the compiled kernels.",
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="also delete the compiled-kernel folder (CACHE_DIR/kernels)",
    )
    p.set_defaults(run=results.clear)

    p = commands.add_parser(
        "bench",
        help="a shape suite (public, serving): tuned_gemm against cuBLAS",
        description="Time tuned_gemm and torch.matmul (cuBLAS), each alone in windows taken in "
        "turn, cold L2, on every "
        "shape of the suite, after checking tuned_gemm's result. ratio = cublas_ms / ours_ms "
        "(above 1: gemmtune is faster). Needs a CUDA GPU.",
    )
    p.add_argument(
        "--suite",
        choices=list(bench.SUITES),
        default="public",
        help="a suite shipped with gemmtune: public (the default) or serving",
    )
    p.add_argument(
        "--shapes",
        type=Path,
        metavar="FILE",
        help='a shape suite of your own, {"shapes": [{"name", "m", "n", "k"}, ...]} '
        "(instead of --suite)",
    )
    p.add_argument("--dtype", choices=KERNEL_INPUTS, default="bf16", help="a's and b's dtype")
    p.add_argument(
        "--layout",
        choices=list(bench.B_LAYOUTS),
        default="kn",
        help="b row-major (K, N), as in x @ w (kn, the default), or the transpose of a "
        "row-major (N, K) weight, as in x @ w.t() (nk; the layout fp8 needs, and the one "
        "8-bit MMAs read: int8 with kn runs on a K-major copy of b)",
    )
    p.add_argument(
        "--scaling",
        choices=list(SCALINGS),
        default="tensor",
        help="fp8 (e4m3, e5m2): scales per tensor (the default) or per row of a and column of b",
    )
    p.add_argument(
        "--accumulation",
        choices=["fast", "promoted"],
        default="fast",
        help="fp8: use_fast_accum=True (the default) or False, for both contenders",
    )
    p.add_argument(
        "--bias",
        action="store_true",
        help="both contenders add a bias, one element per column of the output in its type "
        "(tuned_gemm's or gemmtune.scaled_mm's, against torch.addmm or torch._scaled_mm's)",
    )
    p.add_argument(
        "--mode",
        choices=[mode for mode in MODES if mode != "off"],
        default="tune",
        help="tuned_gemm's mode: tune (tunes what the cache lacks, the default), cache-only "
        "or heuristic",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=400,
        metavar="N",
        help="at most N timed runs per window of ~100 ms, 3 windows each (default 400)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="start no shape once SECONDS have passed; the rows done so far are the result",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(run=bench.run)

    p = commands.add_parser(
        "cache",
        help="the tuning results: show, clear, export, import",
        description="show and clear are `gemmtune show` and `gemmtune clear`; export writes "
        "every result to a JSON file, import adds the results of such a file.",
    )
    p.add_argument("action", choices=["show", "clear", "export", "import"])
    p.add_argument("file", nargs="?", type=Path, help="the JSON file to export to or import")
    p.add_argument("--json", action="store_true", help="show as JSON")
    p.add_argument("--kernels", action="store_true", help="clear: also delete the compiled kernels")
    p.set_defaults(run=results.cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "cache" and args.action in ("export", "import") and args.file is None:
        parser.error(f"cache {args.action} needs a FILE")
    if args.command == "tune" and (args.shape is None) == (not (args.shapes or args.model_config)):
        parser.error("tune needs --shape, or --shapes / --model-config (not both)")
    if args.command == "tune" and args.configs and (args.exhaustive or args.shape is None):
        parser.error("--configs times one --shape's configs: not with --exhaustive or --shapes")
    if getattr(args, "top_k", 1) < 1 or getattr(args, "runs", 1) < 1:
        parser.error("--top-k and --runs must be at least 1")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
