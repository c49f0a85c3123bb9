"""The `gemmtune` command.

gemmtune doctor                     what this machine offers gemmtune
gemmtune tune --shape MxNxK[xL]     tune one problem now and store the winner
gemmtune show                       the cached tuning results
gemmtune clear [--kernels]          forget them (and the compiled kernels)
gemmtune bench                      the public shape suite against cuBLAS
gemmtune cache show|clear|export|import
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gemmtune.cli import doctor

#: exit code of a command that cannot run here (no GPU, a problem our kernels do not serve)
EXIT_UNAVAILABLE = 2

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
INPUT_DTYPES = ("bf16", "fp16")
LAYOUTS = ("tn", "nn", "nt", "tt")
MODES = ("tune", "cache-only", "heuristic")
NO_GPU = "needs a CUDA GPU (Hopper or Blackwell), and torch sees none"

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


def _dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


def _fail(message: str, code: int = EXIT_UNAVAILABLE) -> int:
    print(message, file=sys.stderr)
    return code


def _num(x: float | None) -> float | None:
    """A float JSON can hold: None for None, NaN and infinities."""
    return x if x is not None and math.isfinite(x) else None


def _tflops(flops: int, ms: float | None) -> float | None:
    return flops / (ms * 1e-3) / 1e12 if ms else None


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: str = "") -> str:
    """An aligned text table; `right` holds one character per column, ">" to align it right."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = []
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            parts.append(
                str(cell).rjust(width) if right[i : i + 1] == ">" else str(cell).ljust(width)
            )
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def _first_line(text: str | None, width: int = 100) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


# -- doctor -------------------------------------------------------------------------------------


def _doctor(args: argparse.Namespace) -> int:
    targets = doctor.COMPILE_TARGETS if args.compile else ()
    report = doctor.report(compile_targets=targets)
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 0 if all(c["ok"] for c in report["compile"]) else 1


# -- tune ---------------------------------------------------------------------------------------


def _problem_facts(problem) -> dict:
    from gemmtune.core.dtypes import label

    return {
        "m": problem.m,
        "n": problem.n,
        "k": problem.k,
        "l": problem.l if problem.batched else None,
        "dtype": label(problem.a_dtype),
        "out_dtype": label(problem.out_dtype),
        "layout": problem.layout,
        "out_major": problem.out_major,
    }


def _tune_report(result, gpu: str) -> dict:
    """The facts of a `TuneResult`, JSON-ready: timed candidates fastest first, then failures."""
    flops = result.problem.flops

    def rank(r) -> float:
        return r.final_ms or r.ms

    # finalists (timed in the final) first: their times are comparable with each other only
    timed = sorted((r for r in result.results if r.ok), key=lambda r: (r.final_ms is None, rank(r)))
    failed = [r for r in result.results if not r.ok]
    rows = [
        {
            "config": r.config.key,
            "ok": r.ok,
            "predicted_us": _num(r.predicted_us),
            "ms": _num(r.ms),
            "final_ms": _num(r.final_ms),
            "tflops": _num(_tflops(flops, rank(r))) if r.ok else None,
            "rel_err": _num(r.rel_err),
            "error": r.error,
        }
        for r in [*timed, *failed]
    ]
    return {
        "problem": _problem_facts(result.problem),
        "gpu": gpu,
        "best": result.best.key if result.best is not None else None,
        "best_ms": _num(result.best_ms),
        "best_tflops": _num(result.best_tflops),
        "cublas_ms": _num(result.cublas_ms),
        "cublas_tflops": _num(_tflops(flops, result.cublas_ms)),
        "backend": result.backend,
        "candidates": result.candidates,
        "compiled": result.compiled,
        "timed": len(timed),
        "failed": len(failed),
        "wall_s": result.wall_s,
        "compile_s": result.compile_s,
        "bench_s": result.bench_s,
        "results": rows,
    }


def _format_tune(report: dict) -> str:
    p = report["problem"]
    shape = f"{p['m']}x{p['n']}x{p['k']}" + (f"x{p['l']}" if p["l"] is not None else "")
    lines = [
        f"gemmtune tune {shape}: {p['dtype']} -> {p['out_dtype']}, layout {p['layout']}, "
        f"output {p['out_major']}-major, on {report['gpu']}",
        "",
    ]
    rows = []
    for r in report["results"]:
        mark = "*" if r["config"] == report["best"] else " "
        rows.append(
            [
                mark + r["config"],
                _fmt(r["predicted_us"], ".1f"),
                _fmt(r["ms"], ".4f"),
                _fmt(r["final_ms"], ".4f"),
                _fmt(r["tflops"], ".1f"),
                _fmt(r["rel_err"], ".1e"),
                _first_line(r["error"]),
            ]
        )
    if rows:
        headers = [" config", "pred us", "ms", "final ms", "TFLOP/s", "rel err", "error"]
        lines += [_table(headers, rows, right="<>>>>><"), ""]
        lines.append("(* the winner; final ms: in windows taken in turn with the other finalists)")
    else:
        lines.append("no candidate was timed")
    if report["best"] is not None:
        lines.append(
            f"winner: {report['best']}  {report['best_ms']:.4f} ms  "
            f"{_fmt(report['best_tflops'], '.1f')} TFLOP/s"
        )
    else:
        lines.append("winner: none of our candidates ran correctly")
    if report["cublas_ms"] is not None:
        line = (
            f"torch.matmul: {report['cublas_ms']:.4f} ms  "
            f"{_fmt(report['cublas_tflops'], '.1f')} TFLOP/s"
        )
        if report["best_ms"]:
            line += f"  (cublas_ms / ours_ms = {report['cublas_ms'] / report['best_ms']:.3f})"
        lines.append(line)
    else:
        lines.append("torch.matmul: not measured")
    lines.append(f"backend: {report['backend']}")
    lines.append(
        f"{report['timed']} timed, {report['failed']} failed, {report['compiled']} compiled, "
        f"of {report['candidates']} candidates; wall {report['wall_s']:.1f} s, "
        f"compile {report['compile_s']:.1f} s (summed over workers), "
        f"bench {report['bench_s']:.1f} s"
    )
    return "\n".join(lines)


def _tune(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        return _fail(f"gemmtune tune {NO_GPU} (try `gemmtune doctor`)")
    from gemmtune.api.dispatch import DISPATCHER
    from gemmtune.core.problem import GemmProblem

    m, n, k, l = args.shape
    try:
        problem = GemmProblem.of_shape(
            m,
            n,
            k,
            l,
            dtype=_dtype(args.dtype),
            out_dtype=_dtype(args.out_dtype) if args.out_dtype else None,
            layout=args.layout,
            out_major=args.out_major,
            device="cuda",
        )
    except ValueError as exc:
        return _fail(f"gemmtune tune: {exc}")
    if not problem.supported:
        return _fail(
            f"gemmtune tune: no gemmtune kernel serves this problem ({problem.fallback_reason}); "
            "tuned_gemm hands it to torch.matmul"
        )
    result = DISPATCHER.tune(
        problem, top_k=args.top_k, exhaustive=args.exhaustive, cublas=not args.no_cublas
    )
    report = _tune_report(result, torch.cuda.get_device_name(problem.device))
    print(json.dumps(report, indent=1) if args.json else _format_tune(report))
    return 0 if report["best"] is not None or report["backend"] == "cublas" else 1


# -- show, clear, cache -------------------------------------------------------------------------


def _key_parts(key: str) -> dict:
    """A results key, `bucket|signature|GPU|SMs|gemmtune version|dsl version`, in its parts."""
    parts = key.split("|")
    parts += [""] * (6 - len(parts))
    return {
        "bucket": parts[0],
        "signature": parts[1],
        "gpu": parts[2],
        "sms": parts[3],
        "versions": [p for p in parts[4:] if p],
    }


def _shape_text(shape: Sequence[int]) -> str:
    m, n, k, l = [*shape, 0, 0, 0, 0][:4]
    if not m:
        return "-"
    return f"{m}x{n}x{k}" + (f"x{l}" if l and l != 1 else "")


def _show(args: argparse.Namespace) -> int:
    from gemmtune.cache.results import ResultsCache

    results = ResultsCache()
    rows = results.items()
    if args.json:
        out = [{"key": k, **_key_parts(k), **json.loads(r.to_json())} for k, r in rows]
        print(json.dumps(out, indent=1))
        return 0
    if rows:
        table = []
        for key, record in rows:
            part = _key_parts(key)
            gpu = f"{part['gpu']} ({part['sms']})" if part["sms"] else part["gpu"]
            table.append(
                [
                    part["bucket"],
                    part["signature"],
                    gpu,
                    _shape_text(record.shape),
                    record.config,
                    _fmt(record.ms, ".4f"),
                    time.strftime("%Y-%m-%d %H:%M", time.localtime(record.tuned_at)),
                ]
            )
        headers = ["bucket", "signature", "GPU", "tuned shape", "winner", "ms", "tuned"]
        print(_table(headers, table, right="<<<><><"))
    print(f"{len(rows)} results in {results.path}")
    return 0


def _clear(args: argparse.Namespace) -> int:
    from gemmtune.cache.results import ResultsCache
    from gemmtune.core.settings import cache_dir

    if getattr(args, "kernels", False):
        folder = cache_dir() / "kernels"
        if folder.is_dir():
            files = [f for f in folder.rglob("*") if f.is_file()]
            size = sum(f.stat().st_size for f in files)
            shutil.rmtree(folder, ignore_errors=True)
            print(f"removed {len(files)} compiled-kernel files ({size / 2**20:.1f} MiB): {folder}")
        else:
            print(f"no compiled kernels at {folder}")
    results = ResultsCache()
    print(f"cleared {results.clear()} results from {results.path}")
    return 0


def _cache(args: argparse.Namespace) -> int:
    from gemmtune.cache.results import ResultsCache

    if args.action == "show":
        return _show(args)
    if args.action == "clear":
        return _clear(args)
    results = ResultsCache()
    try:
        if args.action == "export":
            print(f"exported {results.export(args.file)} results to {args.file}")
        else:
            print(f"imported {results.import_(args.file)} results from {args.file}")
    except (OSError, ValueError, KeyError) as exc:
        return _fail(f"gemmtune cache {args.action}: {exc}", 1)
    return 0


# -- bench --------------------------------------------------------------------------------------


_BENCH_COLUMNS = (
    ("shape", 20, "<"),
    ("m", 6, ">"),
    ("n", 6, ">"),
    ("k", 6, ">"),
    ("ours ms", 9, ">"),
    ("cublas ms", 9, ">"),
    ("ratio", 6, ">"),
    ("ours TF/s", 9, ">"),
    ("cublas TF/s", 11, ">"),
    ("rel err", 8, ">"),
    ("config", 0, "<"),
)


def _bench_line(cells: Sequence[str]) -> str:
    parts = []
    for cell, (_, width, align) in zip(cells, _BENCH_COLUMNS, strict=True):
        parts.append(str(cell).rjust(width) if align == ">" else str(cell).ljust(width))
    return "  ".join(parts).rstrip()


def _bench(args: argparse.Namespace) -> int:
    from gemmtune.cli.bench import compare_with_cublas, load_shape_suite, results_document

    try:
        shapes = load_shape_suite(args.shapes)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _fail(f"gemmtune bench: cannot read the shape suite {args.shapes or ''}: {exc}")
    import torch

    if not torch.cuda.is_available():
        return _fail(f"gemmtune bench {NO_GPU} (try `gemmtune doctor`)")
    from gemmtune.measure.timing import L2Flusher

    flush = L2Flusher(torch.cuda.current_device())
    if not args.json:
        print(
            f"gemmtune bench: {len(shapes)} shapes, {args.dtype}, mode {args.mode}, "
            f"each alone in 3 windows of ~100 ms (at most {args.runs} runs, cold L2), on "
            f"{torch.cuda.get_device_name()}; "
            "ratio = cublas_ms / ours_ms, above 1: gemmtune is faster"
        )
        print(_bench_line([name for name, _, _ in _BENCH_COLUMNS]))
        print(_bench_line(["-" * max(w, len(name)) for name, w, _ in _BENCH_COLUMNS]))
    rows, failed = [], 0
    for shape in shapes:
        try:
            row = compare_with_cublas(shape, args.dtype, args.mode, args.runs, flush)
        except Exception as exc:  # one shape's failure must not lose the others
            failed += 1
            print(
                f"gemmtune bench: {shape.get('name')}: {type(exc).__name__}: {exc}", file=sys.stderr
            )
            rows.append({"shape": shape.get("name"), "error": f"{type(exc).__name__}: {exc}"})
            continue
        failed += not row["correct"]
        rows.append(row)
        if not args.json:
            wrong = "" if row["correct"] else "  WRONG RESULT"
            cells = [
                row["shape"],
                row["m"],
                row["n"],
                row["k"],
                f"{row['ours_ms']:.4f}",
                f"{row['cublas_ms']:.4f}",
                f"{row['ratio']:.3f}",
                f"{row['ours_tflops']:.1f}",
                f"{row['cublas_tflops']:.1f}",
                _fmt(row["rel_err"], ".1e"),
                row["config"] + wrong,
            ]
            print(_bench_line(cells), flush=True)
        torch.cuda.empty_cache()
    if args.json:
        print(json.dumps(results_document(rows, args.mode, args.runs, args.dtype), indent=1))
    else:
        ratios = [r["ratio"] for r in rows if "ratio" in r]
        if ratios:
            geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            wins = sum(r > 1 for r in ratios)
            print(f"geometric mean ratio {geomean:.3f}; gemmtune faster on {wins} of {len(ratios)}")
        if failed:
            print(f"{failed} shapes failed or computed a wrong result")
    return 1 if failed else 0


# -- the parser ---------------------------------------------------------------------------------


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
        required=True,
        metavar="MxNxK[xL]",
        help="the problem: out[m,n] = a[m,k] @ b[k,n]; xL makes it a batch of L products",
    )
    p.add_argument("--dtype", choices=INPUT_DTYPES, default="bf16", help="a's and b's dtype")
    p.add_argument(
        "--out-dtype", choices=tuple(DTYPES), help="the output's dtype (default: --dtype)"
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
        "--exhaustive", action="store_true", help="time every valid config (slow), not the top K"
    )
    p.add_argument(
        "--no-cublas",
        action="store_true",
        help="leave torch.matmul (cuBLAS) out of the final, so a gemmtune kernel always wins",
    )
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    p.set_defaults(run=_tune)

    p = commands.add_parser(
        "show",
        help="show the cached tuning results",
        description="List the tuning results cache: bucket, kernel signature, GPU, the shape "
        "tuned, the winning config (or cublas), its time and when it was tuned.",
    )
    p.add_argument("--json", action="store_true", help="print the results as a JSON list")
    p.set_defaults(run=_show)

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
    p.set_defaults(run=_clear)

    p = commands.add_parser(
        "bench",
        help="the public shape suite: tuned_gemm against cuBLAS",
        description="Time tuned_gemm and torch.matmul (cuBLAS), each alone in windows taken in "
        "turn, cold L2, on every "
        "shape of the suite, after checking tuned_gemm's result. ratio = cublas_ms / ours_ms "
        "(above 1: gemmtune is faster). Needs a CUDA GPU.",
    )
    p.add_argument(
        "--shapes",
        type=Path,
        metavar="FILE",
        help='a shape suite, {"shapes": [{"name", "m", "n", "k"}, ...]} '
        "(default: the one shipped with gemmtune)",
    )
    p.add_argument("--dtype", choices=INPUT_DTYPES, default="bf16", help="a's and b's dtype")
    p.add_argument(
        "--mode",
        choices=MODES,
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
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(run=_bench)

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
    p.set_defaults(run=_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "cache" and args.action in ("export", "import") and args.file is None:
        parser.error(f"cache {args.action} needs a FILE")
    if getattr(args, "top_k", 1) < 1 or getattr(args, "runs", 1) < 1:
        parser.error("--top-k and --runs must be at least 1")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
