"""`gemmtune tune`: tune one problem now, store the winner, and show every candidate."""

from __future__ import annotations

import argparse
import json
import math

from gemmtune.cli.text import NO_GPU, fail, first_line, fmt, num, table, tflops
from gemmtune.core.dtypes import torch_dtype


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
        "bias": problem.bias,
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
            "predicted_us": num(r.predicted_us),
            "ms": num(r.ms),
            "final_ms": num(r.final_ms),
            "tflops": num(tflops(flops, rank(r))) if r.ok else None,
            "rel_err": num(r.rel_err),
            "error": r.error,
        }
        for r in [*timed, *failed]
    ]
    return {
        "problem": _problem_facts(result.problem),
        "gpu": gpu,
        "best": result.best.key if result.best is not None else None,
        "best_ms": num(result.best_ms),
        "best_tflops": num(result.best_tflops),
        "cublas_ms": num(result.cublas_ms),
        "cublas_tflops": num(tflops(flops, result.cublas_ms)),
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
        f"output {p['out_major']}-major{', plus a bias' if p.get('bias') else ''}, "
        f"on {report['gpu']}",
        "",
    ]
    rows = []
    for r in report["results"]:
        mark = "*" if r["config"] == report["best"] else " "
        rows.append(
            [
                mark + r["config"],
                fmt(r["predicted_us"], ".1f"),
                fmt(r["ms"], ".4f"),
                fmt(r["final_ms"], ".4f"),
                fmt(r["tflops"], ".1f"),
                fmt(r["rel_err"], ".1e"),
                first_line(r["error"]),
            ]
        )
    if rows:
        headers = [" config", "pred us", "ms", "final ms", "TFLOP/s", "rel err", "error"]
        lines += [table(headers, rows, right="<>>>>><"), ""]
        lines.append("(* the winner; final ms: in windows taken in turn with the other finalists)")
    else:
        lines.append("no candidate was timed")
    if report["best"] is not None:
        lines.append(
            f"winner: {report['best']}  {report['best_ms']:.4f} ms  "
            f"{fmt(report['best_tflops'], '.1f')} TFLOP/s"
        )
    else:
        lines.append("winner: none of our candidates ran correctly")
    if report["cublas_ms"] is not None:
        line = (
            f"torch.matmul: {report['cublas_ms']:.4f} ms  "
            f"{fmt(report['cublas_tflops'], '.1f')} TFLOP/s"
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


def run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        return fail(f"gemmtune tune {NO_GPU} (try `gemmtune doctor`)")
    from gemmtune.api.dispatch import DISPATCHER
    from gemmtune.core.problem import GemmProblem

    m, n, k, l = args.shape
    try:
        problem = GemmProblem.of_shape(
            m,
            n,
            k,
            l,
            dtype=torch_dtype(args.dtype),
            out_dtype=torch_dtype(args.out_dtype) if args.out_dtype else None,
            layout=args.layout,
            out_major=args.out_major,
            device="cuda",
            bias=args.bias,
        )
    except ValueError as exc:
        return fail(f"gemmtune tune: {exc}")
    if not problem.supported:
        return fail(
            f"gemmtune tune: no gemmtune kernel serves this problem ({problem.fallback_reason}); "
            "tuned_gemm hands it to torch.matmul"
        )
    options = {"top_k": args.top_k, "exhaustive": args.exhaustive, "cublas": not args.no_cublas}
    if args.configs:
        # the keys name raster and swizzle too: no sweep, and every one in the final
        options.update(
            configs=args.configs, sweep=0, finalists=len(args.configs), final_margin=math.inf
        )
    result = DISPATCHER.tune(problem, **options)
    report = _tune_report(result, torch.cuda.get_device_name(problem.device))
    print(json.dumps(report, indent=1) if args.json else _format_tune(report))
    return 0 if report["best"] is not None or report["backend"] == "cublas" else 1
