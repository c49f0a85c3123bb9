"""A results file as a PNG of horizontal bars: the ratio to cuBLAS of kernel rows per shape
(one colour per contender and dtype), the microseconds of overhead rows, or the seconds of
tuning rows per shape and phase.

matplotlib is an optional extra (`pip install -e ".[plot]"`); it draws with its Agg backend
(no display needed).

    python -m benchmarks plot FILE.json [--out PNG]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import NamedTuple


class NothingToPlot(ValueError):
    """The file holds no rows of a kind `plot` draws."""


def require_matplotlib() -> ModuleType:
    """matplotlib's pyplot on the Agg backend, or SystemExit saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "plotting needs matplotlib: pip install matplotlib (or the extra: "
            'pip install -e ".[plot]")'
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load(path: Path) -> dict:
    """A results document, gzipped (`.json.gz`) or not."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


class Chart(NamedTuple):
    """What to draw of a results document."""

    xlabel: str
    series: dict[str, dict[str, float]]  # series (a colour) -> {bar label -> value}
    reference: float | None  # where to draw a vertical line
    value_format: str  # of the value printed beside each bar


def is_kernel_row(row: dict) -> bool:
    """A kernel row (benchmarks/README.md), timed against cuBLAS (other rows may hold a `ratio`)."""
    return "ratio" in row and "cublas_ms" in row and "shape" in row


def chart(doc: dict) -> Chart:
    """The chart of a results document. Rows with an "error" are left out; where a file holds
    several configs of one shape (peers), a series shows the best of them."""
    rows = [r for r in doc["rows"] if "error" not in r]
    series: dict[str, dict[str, float]] = defaultdict(dict)

    def keep_best(name: str, label: str, value: float) -> None:
        series[name][label] = max(value, series[name].get(label, value))

    if any(map(is_kernel_row, rows)):
        for r in filter(is_kernel_row, rows):
            dtype = r.get("dtype", "")
            keep_best(f"{r.get('contender', 'gemmtune')} {dtype}".strip(), r["shape"], r["ratio"])
            if "quack_ratio" in r:  # the peers suite: QuACK's ratio, measured beside ours
                keep_best(f"quack {dtype}".strip(), r["shape"], r["quack_ratio"])
        return Chart("cuBLAS time / time (above 1: faster than cuBLAS)", series, 1.0, "%.3f")
    if any("tune_wall_s" in r for r in rows):
        for r in rows:
            if "tune_wall_s" in r:
                series[r.get("phase", "tune")][r.get("shape", "?")] = r["tune_wall_s"]
        return Chart("seconds of the first call (tuning included)", series, None, "%.1f")
    for r in rows:
        if "us" in r and "what" in r:
            series["host time"][r["what"]] = r["us"]
    if series:
        return Chart("microseconds per call", series, 0.0, "%.2f")
    raise NothingToPlot(
        f"no rows to plot in a {doc.get('what')!r} file: plot draws kernel rows (ratio to "
        "cuBLAS), tuning rows (tune_wall_s) and overhead rows (us)"
    )


def title(path: Path, doc: dict) -> str:
    """'public on NVIDIA H200 (132 SMs), 2026-11-24': the file's name before its GPU tag and
    date, the GPU, the date."""
    stem = path.name.split(".json")[0]
    head = stem.split(f"-{doc.get('date')}")[0]
    suite, _, tag = head.rpartition("-")
    if suite and tag and tag in str(doc.get("gpu", "")).lower():
        head = suite
    return f"{head} on {doc.get('gpu')} ({doc.get('sms')} SMs), {doc.get('date')}"


def plot(results_path: Path, out_path: Path | None = None) -> Path:
    """Draw the results file `results_path` as a PNG (default: beside it, same name); the PNG's
    path. Raises NothingToPlot for a file without kernel, overhead or tuning rows."""
    results_path = Path(results_path)
    doc = load(results_path)
    xlabel, series, reference, value_format = chart(doc)
    plt = require_matplotlib()
    labels = list(dict.fromkeys(label for values in series.values() for label in values))
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(labels) * len(series) + 1.6))
    for i, (name, values) in enumerate(series.items()):
        ys = [j + i * height for j, label in enumerate(labels) if label in values]
        drawn = ax.barh(ys, [values[lb] for lb in labels if lb in values], height, label=name)
        ax.bar_label(drawn, fmt=value_format, fontsize=7, padding=2)
    ax.set_yticks([j + height * (len(series) - 1) / 2 for j in range(len(labels))], labels)
    ax.invert_yaxis()  # the file's first row on top
    if reference is not None:
        ax.axvline(reference, color="black", linewidth=0.8)
    if reference == 1.0:  # ratios: zoom on the interesting band around cuBLAS
        values = [v for row in series.values() for v in row.values()]
        ax.set_xlim(min(0.8, min(values) - 0.03), max(1.2, max(values) + 0.05))
    ax.set_xlabel(xlabel)
    ax.set_title(title(results_path, doc), fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    if out_path is None:
        out_path = results_path.with_name(results_path.name.split(".json")[0] + ".png")
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return Path(out_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks plot", description=__doc__)
    parser.add_argument("results", type=Path, help="a results file (.json or .json.gz)")
    parser.add_argument("--out", type=Path, help="the PNG (default: beside the results file)")
    args = parser.parse_args(argv)
    try:
        print(plot(args.results, args.out))
    except NothingToPlot as exc:
        raise SystemExit(f"python -m benchmarks plot: {exc}") from None
    return 0
