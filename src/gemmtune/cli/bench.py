"""A shape suite, run through tuned_gemm against cuBLAS (`gemmtune bench`).

The suites ship with gemmtune (`SUITES`): "public", the shapes the project is judged on, and
"serving", where LLM serving spends its GEMM time (decode batches against Llama-3 8B and 70B
projections, ragged prefill and mid-size problems, small outputs over long K; each shape says
where it comes from). Each shape: `torch.randn` operands (int8: uniform over its 256 values;
fp8: rounded to it, with scales from [0.5, 1.5) per tensor or per row and column, `--scaling`),
`b` row-major (K, N) as in `x @ w`,
or the transpose of a row-major (N, K) weight as in a linear layer's `x @ w.t()` (`--layout
nk`); one tuned_gemm call (which tunes its bucket in mode "tune"), a correctness check
against a float32 reference (int8: the exact int32 product), then tuned_gemm and torch.matmul
(int8: gemmtune.int_mm and torch._int_mm; fp8: gemmtune.scaled_mm and torch._scaled_mm, both
with fast accumulation and a bf16 output) timed on the same tensors, each alone in windows
of about 100 ms taken in turn three times (`time_in_windows`: each at the clocks its own
power allows), L2 emptied by a read before every run, each run on the next of up to four
placements of the operands (`measure.runner.fitting_copies`; the row's `placements`). Each
row also says how many bytes per second each moved (`gbps`: A and B read once, the output
written once) and what fraction that is of the GPU's memory bandwidth, measured at the start
of the run (`bw_fraction`, `measure.bandwidth`). Where torch refuses a valid call
(`torch._scaled_mm` with per-row scales and a bias at some sizes: cuBLASLt has no algorithm)
the row times ours alone and says why (`torch_error`), with no ratio. With `--time-limit` no
shape starts once that many seconds have passed: the rows done so far are the result, and its
method says where it stopped (a device call of bounded length keeps what it measured).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from time import monotonic

import torch

from gemmtune.cli import text
from gemmtune.cli.text import NO_GPU, fail, fmt
from gemmtune.core.dtypes import FP8, torch_dtype
from gemmtune.core.problem import declined_by_cublas
from gemmtune.core.versions import software
from gemmtune.measure.timing import time_in_windows
from gemmtune.measure.verify import check

#: The suites gemmtune ships, by name: their files in `gemmtune.measure`.
SUITES = {"public": "shapes.json", "serving": "serving.json"}
#: `--layout`: how b is laid out. "kn": row-major (K, N), `x @ w`; "nk": the transpose of a
#: row-major (N, K) weight, `x @ w.t()` as a linear layer multiplies. Values: the row's
#: layout name (A then B, "t" meaning K-major).
B_LAYOUTS = {"kn": "tn", "nk": "tt"}


def load_shape_suite(path: Path | str | None = None, suite: str = "public") -> list[dict]:
    """A shape suite: `{"note": ..., "shapes": [{"name", "m", "n", "k", ...}, ...]}`, from
    `path` or, by default, the suite `suite` that ships with gemmtune (`SUITES`)."""
    if path is None:
        if suite not in SUITES:
            raise KeyError(f"no suite {suite!r}: the suites are {', '.join(SUITES)}")
        text = resources.files("gemmtune.measure").joinpath(SUITES[suite]).read_text()
    else:
        text = Path(path).read_text()
    data = json.loads(text)
    shapes = data["shapes"] if isinstance(data, dict) else data
    for i, shape in enumerate(shapes):
        missing = {"m", "n", "k"} - set(shape)
        if missing:
            raise ValueError(f"shape {i} lacks {', '.join(sorted(missing))}")
        shape.setdefault("name", f"{shape['m']}x{shape['n']}x{shape['k']}")
    return shapes


def plan_config(
    a, b, mode: str, scales: tuple = (), fast_accum: bool = True, bias: torch.Tensor | None = None
) -> str:
    """The config tuned_gemm's plan for (a, b) (+ `bias`) uses (scaled_mm's, given `scales`):
    its key, or "cublas" where torch serves."""
    from gemmtune.api.dispatch import DISPATCHER
    from gemmtune.core.config import CUBLAS

    if scales:
        plan = DISPATCHER.scaled_plan(a, b, *scales, FP8_OUT, fast_accum, bias=bias)
    else:
        plan = DISPATCHER.plan(a, b, mode=mode, bias=bias)
    return CUBLAS if plan is None or plan.config is None else plan.config.key


#: What the benchmark's fp8 products are written as
FP8_OUT = torch.bfloat16


def contenders(
    mode: str, scales: tuple, fast_accum: bool = True, bias: torch.Tensor | None = None
) -> tuple:
    """(ours, torch's) as functions of (a, b): tuned_gemm and torch.matmul (with a `bias`:
    tuned_gemm's and torch.addmm), or for int8 the product through tuned_gemm and
    torch._int_mm, or for fp8 (`scales`) gemmtune.scaled_mm and torch._scaled_mm, both with
    `use_fast_accum=fast_accum` and `bias`."""
    from gemmtune.api.dispatch import scaled_mm, tuned_gemm
    from gemmtune.measure.runner import torch_product

    if scales:
        options = {"out_dtype": FP8_OUT, "use_fast_accum": fast_accum, "bias": bias}
        return (
            lambda a, b: scaled_mm(a, b, *scales, **options),
            lambda a, b: torch._scaled_mm(a, b, *scales, **options),
        )
    if bias is not None:
        return (
            functools.partial(tuned_gemm, mode=mode, bias=bias),
            functools.partial(torch_product, bias=bias),
        )
    return functools.partial(tuned_gemm, mode=mode), torch_product


# as triton's do_bench and the baselines: long enough for the GPU's clocks to follow the kernel
WINDOW_MS = 100.0


def compare_with_cublas(
    shape: dict,
    dtype_name: str,
    mode: str,
    runs: int,
    flush,
    b_layout: str = "kn",
    reference_gbps: float | None = None,
    scaling: str = "tensor",
    fast_accum: bool = True,
    bias: bool = False,
) -> dict:
    """One results row (the kernel-row keys of `benchmarks/results/`) for one suite shape;
    `scaling` and `fast_accum` are an fp8 product's; `bias` adds one (one element per column,
    randn times the square root of K, in the output's type) in both contenders."""
    from gemmtune.kernels.signature import KernelSignature
    from gemmtune.measure.bandwidth import gemm_bytes
    from gemmtune.measure.runner import (
        fitting_copies,
        random_bias,
        random_scales,
        random_tensor,
        reference_product,
        taking_turns,
    )

    m, n, k = int(shape["m"]), int(shape["n"]), int(shape["k"])
    dtype = torch_dtype(dtype_name)
    fp8 = dtype_name in FP8
    # torch._scaled_mm takes k and n in multiples of 16 only, and so gemmtune.scaled_mm, its
    # drop-in: other fp8 shapes are multiplied as their users must, zero-padded
    kp, np_ = (-(-k // 16) * 16, -(-n // 16) * 16) if fp8 else (k, n)
    a = random_tensor((m, kp), dtype)
    b = random_tensor((np_, kp), dtype).t() if b_layout == "nk" else random_tensor((kp, np_), dtype)
    if (kp, np_) != (k, n):
        a[:, k:] = 0
        b[k:, :] = 0
    scales, biases = (), None
    if fp8 or bias:
        signature = KernelSignature(
            dtype_name, "bf16" if fp8 else dtype_name, "k", "k", scaling=scaling if fp8 else "",
            bias=bias,
        )  # fmt: skip
        scales = random_scales(signature, m, np_, a.device)
        biases = random_bias(signature, np_, k, a.device)
    ours_fn, torch_fn = contenders(mode, scales, fast_accum, biases)
    ours_fn(a, b)  # tunes the shape's bucket in mode "tune" (fp8: after torch's first answer)
    ours_fn(a, b)
    ok, err = check(ours_fn(a, b), reference_product(a, b, scales, biases), a.dtype)
    config = plan_config(a, b, mode, scales, fast_accum, biases)
    # some kernels' times, torch's among them, depend on where their operands lie, by a few
    # percent: one allocation would decide a ratio by luck (`docs/tuning.md`)
    placed = fitting_copies(a, b)
    declined = torch_refusal(torch_fn, a, b)
    contenders_run = [ours_fn] if declined else [ours_fn, torch_fn]
    ours, *cublas = time_in_windows(
        [taking_turns(fn, placed) for fn in contenders_run],
        window_ms=WINDOW_MS,
        max_runs=runs,
        flush=flush,
    )
    flops = 2 * m * n * k
    moved = gemm_bytes(m, n, k, a.element_size(), output_itemsize(a))
    row = {
        "shape": shape["name"],
        "m": m,
        "n": n,
        "k": k,
        "l": 1,
        "dtype": dtype_name,
        "layout": B_LAYOUTS[b_layout],
        "config": config,
        "ours_ms": ours.median_ms,
        "ours_tflops": flops / (ours.median_ms * 1e-3) / 1e12,
        "rel_err": err if math.isfinite(err) else None,
        "correct": ok,
        "mode": mode,
        "gbps": moved / (ours.median_ms * 1e-3) / 1e9,
        "placements": len(placed),
    }
    if declined:  # no ratio: torch has no time for a product it refuses
        row["torch_error"] = declined
    else:
        torch_ms = cublas[0].median_ms
        row.update(
            cublas_ms=torch_ms,
            ratio=torch_ms / ours.median_ms,
            cublas_tflops=flops / (torch_ms * 1e-3) / 1e12,
            cublas_gbps=moved / (torch_ms * 1e-3) / 1e9,
        )
    if (kp, np_) != (k, n):
        row["padded_to"] = {"k": kp, "n": np_}
    if fp8:
        row.update(scaling=scaling, use_fast_accum=fast_accum)
    if fp8 or bias:
        row["bias"] = bias
    if reference_gbps:
        row["bw_fraction"] = row["gbps"] / reference_gbps
        if not declined:
            row["cublas_bw_fraction"] = row["cublas_gbps"] / reference_gbps
    if mode == "tune" and (tuned := tuned_here(m, np_, kp)) is not None:
        row["tuned"] = tuned
    return row


def torch_refusal(torch_fn: Callable, a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why torch's contender refuses a valid call (cuBLASLt finding no algorithm: fp8 with
    per-row scales and a bias at some sizes), None where it answers it; any other error of
    torch's is raised."""
    try:
        torch_fn(a, b)
    except RuntimeError as error:
        if not declined_by_cublas(error):
            raise
        return f"{type(error).__name__}: {error}"
    return None


def tuned_here(m: int, n: int, k: int) -> dict | None:
    """What the results cache says of the tune (or shape check) made on this very shape: its
    winner, time and how it was found (the tuner's own view, torch.matmul's final time
    among it), so that a row's choice can be audited; None where none was made on it."""
    from gemmtune.api.dispatch import DISPATCHER

    made = [
        (key, record)
        for key, record in DISPATCHER.chooser.results_cache().items()
        if record.shape == (m, n, k, 1)
    ]
    if not made:
        return None
    key, record = max(made, key=lambda item: item[1].tuned_at)
    return {"key": key, "config": record.config, "ms": record.ms, "how": record.how}


def output_itemsize(a) -> int:
    """Bytes per element of what `a @ b` writes: a's, int32's for int8, bf16's for fp8."""
    if a.dtype == torch.int8:
        return 4
    return FP8_OUT.itemsize if a.element_size() == 1 else a.element_size()


def results_document(
    rows: list[dict],
    mode: str,
    runs: int,
    dtype_name: str,
    bandwidth: dict | None = None,
    stopped: str | None = None,
) -> dict:
    """The rows as a benchmark results file (the format of `benchmarks/results/`); `stopped`
    says why shapes of the suite have no row (a time limit)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "what": "kernel",
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "versions": software(),
        "date": datetime.date.today().isoformat(),
        "method": (
            f"gemmtune bench --mode {mode}: tuned_gemm against torch.matmul, each alone in "
            f"windows of ~{WINDOW_MS:.0f} ms (at most {runs} runs) taken in turn 3 times, 10 ms "
            f"warm-up before each, CUDA events, L2 emptied before every run (a read of twice its "
            f"size), each run on the next of the row's `placements` copies of the operands (up "
            f"to 4 within 2 GiB, each after a gap of an odd number of MiB; both contenders on "
            f"the same copies), median of all its runs; bytes moved = A and B read once, the "
            f"output written once; the GPU's memory bandwidth {bandwidth} (measure.bandwidth: "
            f"a sum and a copy over 2 GiB, medians, the faster the reference of bw_fraction); "
            + (f"{stopped}; " if stopped else "")
            + f"{dtype_name} torch.randn inputs"
        ),
        "rows": rows,
    }


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


def _bench_line(cells: Sequence[object]) -> str:
    widths = [width for _, width, _ in _BENCH_COLUMNS]
    return text.row(cells, widths, "".join(align for _, _, align in _BENCH_COLUMNS))


def time_is_up(started: float, limit: float | None) -> bool:
    """Whether `limit` seconds (None: no limit) have passed since `started` (`monotonic`)."""
    return limit is not None and monotonic() - started >= limit


def run(args: argparse.Namespace) -> int:
    started = monotonic()
    try:
        shapes = load_shape_suite(args.shapes, args.suite)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return fail(f"gemmtune bench: cannot read the shape suite {args.shapes or ''}: {exc}")
    if args.dtype in FP8 and args.layout != "nk":
        return fail(
            "gemmtune bench: fp8 needs --layout nk (torch._scaled_mm, and gemmtune.scaled_mm, "
            "take b column-major: x @ w.t())"
        )
    if args.bias and args.dtype == "int8":
        return fail("gemmtune bench: --bias is for 16-bit and fp8 inputs (int8 products take none)")
    import torch

    if not torch.cuda.is_available():
        return fail(f"gemmtune bench {NO_GPU} (try `gemmtune doctor`)")
    from gemmtune.measure.bandwidth import measure_bandwidth
    from gemmtune.measure.timing import L2Flusher

    flush = L2Flusher(torch.cuda.current_device())
    bandwidth = measure_bandwidth()
    if not args.json:
        print(
            f"gemmtune bench: {len(shapes)} shapes, {args.dtype}, mode {args.mode}, "
            f"each alone in 3 windows of ~100 ms (at most {args.runs} runs, cold L2), on "
            f"{torch.cuda.get_device_name()}; "
            "ratio = cublas_ms / ours_ms, above 1: gemmtune is faster"
        )
        print(_bench_line([name for name, _, _ in _BENCH_COLUMNS]))
        print(_bench_line(["-" * max(w, len(name)) for name, w, _ in _BENCH_COLUMNS]))
    rows, failed, stopped = [], 0, None
    for done, shape in enumerate(shapes):
        if time_is_up(started, args.time_limit):
            stopped = (
                f"stopped by --time-limit {args.time_limit:g} s after {done} of {len(shapes)} "
                "shapes"
            )
            print(f"gemmtune bench: {stopped}", file=sys.stderr)
            break
        try:
            row = compare_with_cublas(
                shape, args.dtype, args.mode, args.runs, flush, args.layout,
                bandwidth.reference_gbps, args.scaling, args.accumulation == "fast", args.bias,
            )  # fmt: skip
        except Exception as exc:  # one shape's failure must not lose the others
            failed += 1
            print(
                f"gemmtune bench: {shape.get('name')}: {type(exc).__name__}: {exc}", file=sys.stderr
            )
            rows.append({"shape": shape.get("name"), "error": f"{type(exc).__name__}: {exc}"})
            continue
        failed += not row["correct"]
        row["suite"] = args.suite if args.shapes is None else str(args.shapes)
        rows.append(row)
        if not args.json:
            wrong = "" if row["correct"] else "  WRONG RESULT"
            cells = [
                row["shape"],
                row["m"],
                row["n"],
                row["k"],
                f"{row['ours_ms']:.4f}",
                fmt(row.get("cublas_ms"), ".4f"),
                fmt(row.get("ratio"), ".3f"),
                f"{row['ours_tflops']:.1f}",
                fmt(row.get("cublas_tflops"), ".1f"),
                fmt(row["rel_err"], ".1e"),
                row["config"] + wrong,
            ]
            print(_bench_line(cells), flush=True)
        torch.cuda.empty_cache()
    if args.json:
        found = {
            "read_gbps": round(bandwidth.read_gbps, 1),
            "copy_gbps": round(bandwidth.copy_gbps, 1),
        }
        document = results_document(rows, args.mode, args.runs, args.dtype, found, stopped)
        print(json.dumps(document, indent=1))
    else:
        ratios = [r["ratio"] for r in rows if "ratio" in r]
        if ratios:
            geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            wins = sum(r > 1 for r in ratios)
            print(f"geometric mean ratio {geomean:.3f}; gemmtune faster on {wins} of {len(ratios)}")
        if failed:
            print(f"{failed} shapes failed or computed a wrong result")
    return 1 if failed else 0
