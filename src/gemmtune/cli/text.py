"""Text output of the command line: aligned tables, numbers, failures."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

#: exit code of a command that cannot run here (no GPU, a problem our kernels do not serve)
EXIT_UNAVAILABLE = 2

NO_GPU = "needs a CUDA GPU (Hopper or Blackwell), and torch sees none"


def fail(message: str, code: int = EXIT_UNAVAILABLE) -> int:
    print(message, file=sys.stderr)
    return code


def num(x: float | None) -> float | None:
    """A float JSON can hold: None for None, NaN and infinities."""
    return x if x is not None and math.isfinite(x) else None


def tflops(flops: int, ms: float | None) -> float | None:
    return flops / (ms * 1e-3) / 1e12 if ms else None


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def row(cells: Sequence[object], widths: Sequence[int], right: str = "") -> str:
    """One line of an aligned table; `right` holds one character per column, ">" to align it
    right. Commands that print rows as they come use it with fixed widths."""
    parts = []
    for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
        text = str(cell)
        parts.append(text.rjust(width) if right[i : i + 1] == ">" else text.ljust(width))
    return "  ".join(parts).rstrip()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: str = "") -> str:
    """An aligned text table with a rule under the headers, columns as wide as their cells."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([row(headers, widths, right), rule, *(row(r, widths, right) for r in rows)])


def first_line(text: str | None, width: int = 100) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."
