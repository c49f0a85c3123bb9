"""Shared plumbing of the benchmark scripts: environment facts and the results file format
(`benchmarks/results/<what>-<gpu>-<date>.json`, as ../shared/bench/RESULTS.md describes)."""

from __future__ import annotations

import datetime
import gzip
import importlib.metadata as metadata
import json
from pathlib import Path

import torch

import gemmtune

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SHAPES = Path(gemmtune.__file__).resolve().parent / "bench" / "shapes.json"  # the shape suite


def load_shapes(path: Path = SHAPES) -> list[dict]:
    return json.loads(path.read_text())["shapes"]


def gpu_tag() -> str:
    """'h100', 'h200', ... for file names."""
    name = torch.cuda.get_device_name().lower()
    for tag in ("h200", "h100", "b200", "b100", "gh200", "a100"):
        if tag in name:
            return tag
    return name.replace(" ", "-")


def versions() -> dict:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "gemmtune": gemmtune.__version__,
        "cutlass_dsl": version("nvidia-cutlass-dsl"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def write_results(
    what: str, method: str, rows: list[dict], out_dir: Path = RESULTS, compress: bool = False
) -> Path:
    """Write the results file; `compress` gzips it (`.json.gz`), for raw data sets too large to
    keep in the tree that travels to the GPU machine."""
    props = torch.cuda.get_device_properties(0)
    today = datetime.date.today().isoformat()
    doc = {
        "what": what,
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "versions": versions(),
        "date": today,
        "method": method,
        "rows": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{what}-{gpu_tag()}-{today}.json"
    if compress:
        path = path.with_suffix(".json.gz")
        path.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode()))
    else:
        path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def kernel_row(shape: str, m: int, n: int, k: int, dtype: str, config: str) -> dict:
    """The fields a kernel row (RESULTS.md) starts with: one unbatched problem, A (m,k) and
    B (k,n) row-major ("tn"); each script adds its own after them."""
    return {
        "shape": shape,
        "m": m,
        "n": n,
        "k": k,
        "l": 1,
        "dtype": dtype,
        "layout": "tn",
        "config": config,
    }


def tflops(m: int, n: int, k: int, l: int, ms: float) -> float:
    return 2 * m * n * k * l / (ms * 1e-3) / 1e12
