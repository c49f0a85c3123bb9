"""Decode through a stack of layers: the decode rows of a serving results file, each run the way a
model runs it, the same projection of several layers one after another in one CUDA graph.

The serving suite times a decode GEMM alone: the L2 emptied, a launch hold, then the kernel
between two events. That times what a kernel costs on its own, the first event to the first
bytes, the pipeline's fill and the last wave's drain included (`python -m benchmarks
read-ceiling`: a one-element kernel takes 4.3 µs so timed on an H100). A model's decode step
runs its layers back to back, captured in a CUDA graph, and each layer's weight is cold in L2
because the layers after it evicted it. Here every decode row (m <= `--max-m`) of the file runs
`layers` copies of its weight, as many as fill four L2s (at least two), one GEMM per copy, in a
graph replayed in windows taken in turn (`time_in_windows`, no flush: no copy is in L2 when its
turn comes); per GEMM, the replay's time over the copies. Three contenders over the same
tensors: the row's config (what the tuner picked for it, our kernels alone), torch's product
(`torch.mm`; for fp8 rows `torch._scaled_mm` with the row's scaling and accumulation, into bf16
as the serving suite runs it), and a read of each copy (a Triton kernel that only reads, else
`torch.sum`): what reading the weights costs in the same stack. `bw_fraction` is of the 2 GiB
read or copy rate of the same run (`gemmtune.measure.bandwidth`), as in the serving suite.
With `--constant-weights` a fourth: the row's config built for a constant b (what
`tuned_gemm(..., constant_b=True)` runs: each layer's kernel starts loading its weight before
the layer ahead of it finishes), in the `constant_b_*` fields.

    python -m benchmarks decode-chain --results FILE.json[.gz] [--out-dir DIR] [--max-m 64]
        [--constant-weights]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from benchmarks.common import RESULTS, compile_and_load, write_results
from benchmarks.plot import load
from benchmarks.read_ceiling import STREAM_BLOCK, stream_reader

SUITE_HELP = "decode rows of a serving results file, each run over a stack of layers in a graph"

#: the weights of a row's stack fill this many L2s, so that none is in L2 when its turn comes
L2_FILLS = 4
#: the fewest layers of a stack
MIN_LAYERS = 2
#: the input types of the rows it runs: 16-bit, and fp8 with its scales
CHAIN_DTYPES = ("bf16", "fp16", "e4m3")


def decode_rows(results: Path, max_m: int) -> list[dict]:
    """The kernel rows of a serving results file with at most `max_m` rows of 16-bit or e4m3
    inputs, our kernels alone (contender "kernels")."""
    return [
        row
        for row in load(results)["rows"]
        if row.get("suite") == "serving"
        and row.get("contender", "kernels") == "kernels"
        and row.get("dtype") in CHAIN_DTYPES
        and row["m"] <= max_m
        and row.get("config")
    ]


def layer_count(weight_bytes: int, l2_bytes: int) -> int:
    """Copies of a weight that fill `L2_FILLS` L2s, at least `MIN_LAYERS`."""
    return max(MIN_LAYERS, math.ceil(L2_FILLS * l2_bytes / weight_bytes))


def stack(row: dict, layers: int, device, fill: bool = True):
    """The activations and `layers` weights of a row (torch.randn, fp8 rounded to it, or left
    empty without `fill`), and `b` as its layout gives it: "tt" is `x @ w.t()` (w row-major
    (n, k)), "tn" is `x @ w` (w row-major (k, n))."""
    import torch

    from benchmarks.common import DTYPES
    from gemmtune.measure.runner import random_tensor

    dtype = DTYPES[row["dtype"]]

    def make(*shape):
        if not fill:
            return torch.empty(*shape, device=device, dtype=dtype)
        return random_tensor(shape, dtype, device)

    m, n, k = row["m"], row["n"], row["k"]
    x = make(m, k)
    if row["layout"] not in ("tt", "tn"):
        raise ValueError(f"layout {row['layout']!r}: a linear layer's b is 'tt' or 'tn'")
    shape = (n, k) if row["layout"] == "tt" else (k, n)
    weights = [make(*shape) for _ in range(layers)]
    bs = [w.t() for w in weights] if row["layout"] == "tt" else weights
    return x, weights, bs


def row_problem(row: dict, x, b):
    """The problem a row's GEMM is: an fp8 row's with its scaling and accumulation, into bf16
    as the serving suite runs it."""
    import torch

    from gemmtune.core.problem import GemmProblem

    if row["dtype"] in ("bf16", "fp16"):
        return GemmProblem.from_tensors(x, b)
    return GemmProblem.from_tensors(
        x,
        b,
        out_dtype=torch.bfloat16,
        scaling=row.get("scaling", "tensor"),
        promoted=not row.get("use_fast_accum", True),
    )


def compile_configs(rows: list[dict], device, workers: int, constant_weights: bool = False) -> dict:
    """Each row's kernel, compiled in parallel (with `constant_weights` also built for a
    constant b): keyed by (layout, constant b), then (compile key, A/B dtype) as
    `compile_and_load` keys them (one layout's rows share a signature per dtype)."""
    import dataclasses

    from gemmtune.core.config import GemmConfig
    from gemmtune.kernels.signature import KernelSignature
    from gemmtune.workers.compiler import CompileJob

    jobs: dict[tuple, dict] = {}
    targets = set()
    for row in rows:
        x, _, (b,) = stack(row, 1, device, fill=False)
        problem = row_problem(row, x, b)
        config = GemmConfig.from_key(row["config"])
        for constant in (False, True) if constant_weights else (False,):
            signature = dataclasses.replace(KernelSignature.of(problem), constant_b=constant)
            jobs.setdefault((row["layout"], constant), {})[(config.compile_key, signature.key)] = (
                CompileJob(config, signature)
            )
        targets.add(problem.arch.compile_target)
    (target,) = targets  # one GPU
    return {
        built: compile_and_load(list(found.values()), workers, target)[0]
        for built, found in jobs.items()
    }


def chain_row(
    row: dict,
    kernels: dict,
    reference_gbps: float,
    window_ms: float,
    rounds: int,
    constant_weights: bool = False,
):
    """The row's GEMM over a stack of layers, beside torch's product and a read of the same
    weights (and with `constant_weights` the binary for a constant b); None where a kernel of
    the row did not compile or computed a wrong result."""
    import torch

    from benchmarks.common import DTYPES
    from gemmtune.core.config import GemmConfig
    from gemmtune.kernels.launch import launch
    from gemmtune.kernels.signature import KernelSignature
    from gemmtune.measure.bandwidth import gemm_bytes
    from gemmtune.measure.runner import random_scales, reference_product, torch_product
    from gemmtune.measure.timing import time_in_windows
    from gemmtune.measure.verify import check

    device = torch.device("cuda", torch.cuda.current_device())
    m, n, k = row["m"], row["n"], row["k"]
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    weight_bytes = n * k * DTYPES[row["dtype"]].itemsize
    layers = layer_count(weight_bytes, l2_bytes)
    x, weights, bs = stack(row, layers, device)
    problem = row_problem(row, x, bs[0])
    scales = random_scales(KernelSignature.of(problem), m, n, device)
    fast = not problem.promoted
    config = GemmConfig.from_key(row["config"])
    theirs = [torch.empty((m, n), device=device, dtype=problem.out_dtype) for _ in bs]
    built = [False, True] if constant_weights else [False]
    binaries = [kernels[(row["layout"], c)].get((config.compile_key, row["dtype"])) for c in built]
    if None in binaries:
        return None
    errors = []
    stacks = []
    for kernel in binaries:
        outs = [torch.full_like(theirs[0], float("nan")) for _ in bs]
        for b, out in zip(bs, outs, strict=True):
            launch(kernel, x, b, out, config, scales=scales)
        verdicts = [
            check(out, reference_product(x, b, scales), x.dtype)
            for b, out in zip(bs, outs, strict=True)
        ]
        if not all(ok for ok, _ in verdicts):
            return None
        errors += [err for _, err in verdicts]

        def our_stack(kernel=kernel, outs=outs):
            for b, out in zip(bs, outs, strict=True):
                launch(kernel, x, b, out, config, scales=scales)

        stacks.append(our_stack)
    read = stream_reader()
    # the reader takes 16-bit elements: an fp8 weight is read as half as many of them
    flat = [w.reshape(-1).view(torch.int16 if w.element_size() == 1 else w.dtype) for w in weights]
    partials = torch.empty(-(-flat[0].numel() // STREAM_BLOCK), device=device)
    total = torch.empty((), device=device)

    def torch_stack():
        for b, out in zip(bs, theirs, strict=True):
            if scales:  # its output comes from the graph's pool: no copy into `out`
                torch_product(x, b, scales, problem.out_dtype, fast)
            else:
                torch.mm(x, b, out=out)

    def read_stack():
        for source in flat:
            if read is not None:
                read(source, partials)
            else:
                torch.sum(source, dtype=torch.float32, out=total)

    timings = time_in_windows(
        [stacks[0], torch_stack, read_stack, *stacks[1:]],
        window_ms=window_ms,
        rounds=rounds,
        graph=True,
        rotate=True,
    )
    ours_ms, cublas_ms, read_ms, *constant_ms = (t.median_ms / layers for t in timings)
    moved = gemm_bytes(m, n, k, x.element_size(), theirs[0].element_size())
    gbps = moved / (ours_ms * 1e-3) / 1e9
    cublas_gbps = moved / (cublas_ms * 1e-3) / 1e9
    read_gbps = weight_bytes / (read_ms * 1e-3) / 1e9
    return {
        "shape": row["shape"],
        "m": m,
        "n": n,
        "k": k,
        "l": 1,
        "dtype": row["dtype"],
        "layout": row["layout"],
        "config": row["config"],
        "suite": "serving",
        "mode": "chain",
        "contender": "kernels",
        "layers": layers,
        "ours_ms": round(ours_ms, 5),
        "cublas_ms": round(cublas_ms, 5),
        "ratio": round(cublas_ms / ours_ms, 4),
        "rel_err": max(errors),
        "correct": True,
        "gbps": round(gbps, 1),
        "cublas_gbps": round(cublas_gbps, 1),
        "bw_fraction": round(gbps / reference_gbps, 3),
        "cublas_bw_fraction": round(cublas_gbps / reference_gbps, 3),
        "read_ms": round(read_ms, 5),
        "read_bw_fraction": round(read_gbps / reference_gbps, 3),
        "spread": [round(t.spread, 3) for t in timings],
        **({"scaling": problem.scaling, "use_fast_accum": fast} if scales else {}),
        **(constant_fields(*constant_ms, cublas_ms, moved, reference_gbps) if constant_ms else {}),
    }


def constant_fields(ms: float, cublas_ms: float, moved: int, reference_gbps: float) -> dict:
    """A row's fields for the binary built for a constant b."""
    gbps = moved / (ms * 1e-3) / 1e9
    return {
        "constant_b_ms": round(ms, 5),
        "constant_b_ratio": round(cublas_ms / ms, 4),
        "constant_b_bw_fraction": round(gbps / reference_gbps, 3),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks decode-chain", description=SUITE_HELP
    )
    parser.add_argument("--results", type=Path, required=True, help="a serving results file")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--max-m", type=int, default=64)
    parser.add_argument("--window-ms", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="compile workers")
    parser.add_argument("--name", help="the results file's name before the GPU and date")
    parser.add_argument(
        "--constant-weights",
        action="store_true",
        help="also time each row's config built for a constant b (tuned_gemm's constant_b)",
    )
    args = parser.parse_args(argv)

    import torch

    from gemmtune.measure.bandwidth import measure_bandwidth

    device = torch.device("cuda", torch.cuda.current_device())
    rows = decode_rows(args.results, args.max_m)
    if not rows:
        raise SystemExit(f"{args.results} has no decode rows of at most {args.max_m} rows")
    reference = measure_bandwidth(device)
    kernels = compile_configs(rows, device, args.workers, args.constant_weights)
    out = []
    for row in rows:
        result = chain_row(
            row,
            kernels,
            reference.reference_gbps,
            args.window_ms,
            args.rounds,
            args.constant_weights,
        )
        torch.cuda.empty_cache()
        if result is None:
            print(f"{row['shape']} {row['layout']} {row['config']}: not run", flush=True)
            continue
        out.append(result)
        print(
            f"{row['shape']:18s} {row['layout']} x{result['layers']:<3d} ours "
            f"{result['ours_ms'] * 1e3:7.2f} us {result['bw_fraction']:.2f}  torch "
            f"{result['cublas_ms'] * 1e3:7.2f} us {result['cublas_bw_fraction']:.2f}  read "
            f"{result['read_bw_fraction']:.2f}  ratio {result['ratio']:.3f}"
            + (
                f"  constant b {result['constant_b_ms'] * 1e3:7.2f} us "
                f"{result['constant_b_bw_fraction']:.2f} ratio {result['constant_b_ratio']:.3f}"
                if args.constant_weights
                else ""
            ),
            flush=True,
        )
    method = (
        f"the decode rows (m <= {args.max_m}) of {args.results.name}, each with the config that "
        "file's tune picked (our kernels alone): the row's GEMM over a stack of copies of its "
        f"weight filling {L2_FILLS} L2s (at least {MIN_LAYERS}), one GEMM per copy into its own "
        "output, captured in one CUDA graph; beside it torch's product over the same tensors "
        "(torch.mm; fp8 rows: torch._scaled_mm with the same scales and accumulation, into "
        "bf16) and a read of each copy (a Triton kernel that only reads, 16 KB per program); "
        "the three graphs "
        f"replayed in windows of ~{args.window_ms:g} ms taken in turn {args.rounds} times "
        "(gemmtune.measure.timing.time_in_windows, no flush: the stack evicts each copy before "
        "its turn), CUDA events, median per replay over the layers; torch.randn inputs (fp8: "
        "rounded to it, scales uniform in [0.5, 1.5)); "
        "verified against a float32 reference first; bw_fraction of the GPU's memory bandwidth "
        f"{reference.__dict__} (measure.bandwidth: a sum and a copy over 2 GiB, the faster the "
        "reference), bytes moved = A and B read once, the output written once"
        + (
            "; constant_b_*: the same config built for a constant b (the signature's "
            "constant_b: the kernel's first stages of the weight load before "
            "griddepcontrol.wait), timed as a fourth graph in the same windows"
            if args.constant_weights
            else ""
        )
    )
    return write_results("decode-chain", method, out, args.out_dir, name=args.name)
