"""`gemmtune pretune` (and `gemmtune tune --shapes/--model-config`): tune many GEMMs ahead of
time, on this GPU, on several (`--gpus`), or on the ranks of a `torch.distributed` job."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gemmtune.cli.text import NO_GPU, fail, fmt, table
from gemmtune.core.dtypes import torch_dtype


def gemms_of(args: argparse.Namespace) -> list:
    """The GEMMs the arguments name: a model config's layers at the batch sizes, and a shapes
    file's problems as they are (`{"shapes": [{"m": .., "n": .., "k": .., "l"?: ..,
    "bias"?: true}]}`, the shape suites' format, at `--dtype` and `--layout`)."""
    from gemmtune.api.pretune import GemmShape, linear_gemms, shapes_from_config

    dtype = torch_dtype(args.dtype)
    gemms = []
    if args.model_config:
        config = json.loads(Path(args.model_config).read_text())
        config.setdefault("dtype", args.dtype)
        gemms += linear_gemms(shapes_from_config(config), args.batch_sizes)
    if args.shapes:
        doc = json.loads(Path(args.shapes).read_text())
        for s in doc["shapes"] if isinstance(doc, dict) else doc:
            gemms.append(
                GemmShape(
                    s["m"], s["n"], s["k"], s.get("l"), dtype=dtype, layout=args.layout,
                    bias=bool(s.get("bias", False)),
                )
            )  # fmt: skip
    return gemms


def run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        return fail(f"gemmtune pretune {NO_GPU} (try `gemmtune doctor`)")
    from gemmtune.api.pretune import pretune, pretune_on_gpus

    try:
        gemms = gemms_of(args)
    except (OSError, ValueError, KeyError) as exc:
        return fail(f"gemmtune pretune: {exc}")
    if not gemms:
        return fail("gemmtune pretune: name the GEMMs with --model-config or --shapes")
    gpus = args.gpus or [torch.cuda.current_device()]
    if len(gpus) > 1:
        outcome = pretune_on_gpus(gemms, gpus, progress=not args.json)
    else:
        outcome = pretune(gemms=gemms, device=gpus[0], progress=not args.json)
    rows = [
        {
            "m": r.shape[0],
            "n": r.shape[1],
            "k": r.shape[2],
            "config": r.config,
            "ms": r.record.ms if r.record else None,
            "source": r.source,
        }
        for r in outcome.rows
    ]
    if args.export:
        outcome.export(args.export)
    if args.json:
        print(json.dumps({"gpus": len(gpus), "wall_s": outcome.wall_s, "rows": rows}, indent=1))
    else:
        cells = [
            [f"{r['m']}x{r['n']}x{r['k']}", r["config"] or "-", fmt(r["ms"], ".4f"), r["source"]]
            for r in rows
        ]
        print(table(["shape", "winner", "ms", "source"], cells, right="<<><"))
        print(
            f"{len(rows)} buckets and checked shapes on {len(gpus)} GPU(s) in "
            f"{outcome.wall_s:.1f} s" + (f"; table written to {args.export}" if args.export else "")
        )
    return 0 if all(r["config"] for r in rows) else 1


def add_arguments(p: argparse.ArgumentParser, *, gpus: bool) -> None:
    """The options that name what to pretune (shared by `pretune` and `tune`)."""
    from gemmtune.api.pretune import DEFAULT_BATCH_SIZES

    p.add_argument(
        "--model-config",
        metavar="FILE",
        help='a JSON of layer sizes: {"linears": [{"name": "qkv", "n": 6144, "k": 4096}, ...]} '
        "or a Llama-style config (hidden_size, intermediate_size, num_attention_heads, "
        "num_key_value_heads); its x @ w.t() GEMMs at every --batch-sizes",
    )
    p.add_argument(
        "--shapes",
        metavar="FILE",
        help='a JSON of problems, {"shapes": [{"m": 16, "n": 4096, "k": 4096}, ...]}',
    )
    p.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=list(DEFAULT_BATCH_SIZES),
        metavar="M",
        help="the batch sizes (rows of x) of a model config's layers (default: 1, 2, 4 ... 4096)",
    )
    p.add_argument("--export", metavar="FILE", help="write the table for `gemmtune cache import`")
    if gpus:
        p.add_argument(
            "--gpus",
            type=lambda text: [int(g) for g in text.split(",")],
            metavar="0,1",
            help="split the work over these GPUs, a thread each (default: the current GPU)",
        )
