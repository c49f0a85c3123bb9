"""torch's ways to an int8 `x @ w` of a row-major weight, the layout 8-bit MMAs cannot read.

`gemmtune` multiplies such a product on a K-major copy of `w` made on every call
(`gemmtune.kernels.transpose`); `python -m benchmarks public --dtype int8 --layout kn` times it
against `torch._int_mm(x, w)` as given. This suite times what a torch user could do instead,
each alone in windows taken in turn (`time_in_windows`: the L2 emptied by a read before every
run, the launch hold, median), on the public suite's shapes:

- `as_given`: `torch._int_mm(x, w)`;
- `contiguous_copy`: `torch._int_mm(x, w.t().contiguous().t())`, a K-major copy by torch;
- `tiled_copy`: `torch._int_mm(x, k_major_copy(w, "b"))`, the copy gemmtune makes;
- `copy_alone`: gemmtune's copy of `w` by itself.

Rows: `shape`, `m`, `n`, `k`, `contender`, `ms`, `tops` (2mnk per second; the copy's row: none).

    python -m benchmarks int8-layouts --out-dir DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import RESULTS, write_results
from gemmtune.cli.bench import load_shape_suite

SUITE_HELP = "torch._int_mm on a row-major int8 weight: as given, and on K-major copies of it"


def contenders(x, w) -> dict:
    """The ways to `x @ w` this suite times, by name (and the copy alone)."""
    import torch

    from gemmtune.kernels.transpose import k_major_copy

    return {
        "as_given": lambda: torch._int_mm(x, w),
        "contiguous_copy": lambda: torch._int_mm(x, w.t().contiguous().t()),
        "tiled_copy": lambda: torch._int_mm(x, k_major_copy(w, "b")),
        "copy_alone": lambda: k_major_copy(w, "b"),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks int8-layouts", description=SUITE_HELP
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    import torch

    from gemmtune.kernels.transpose import k_major_copy
    from gemmtune.measure.runner import random_tensor
    from gemmtune.measure.timing import L2Flusher, time_in_windows

    flush = L2Flusher(torch.cuda.current_device())
    rows = []
    for shape in load_shape_suite(suite="public"):
        m, n, k = shape["m"], shape["n"], shape["k"]
        x = random_tensor((m, k), torch.int8)
        w = random_tensor((k, n), torch.int8)
        expected = torch._int_mm(x, w)
        if not torch.equal(torch._int_mm(x, k_major_copy(w, "b")), expected):
            raise SystemExit(f"{shape['name']}: the K-major copy changed the product")
        fns = contenders(x, w)
        timings = time_in_windows(list(fns.values()), window_ms=50.0, max_runs=200, flush=flush)
        for contender, timing in zip(fns, timings, strict=True):
            ms = timing.median_ms
            tops = None if contender == "copy_alone" else 2 * m * n * k / (ms * 1e-3) / 1e12
            rows.append(
                {"shape": shape["name"], "m": m, "n": n, "k": k, "contender": contender,
                 "ms": round(ms, 5), "tops": tops and round(tops, 1)}
            )  # fmt: skip
            print(f"{shape['name']:>20} {contender:>16} {ms:8.4f} ms", flush=True)
    method = (
        "torch._int_mm on x (m, k) and a row-major w (k, n), int8 uniform over its 256 values: "
        "as given, on w.t().contiguous().t(), on gemmtune's tiled K-major copy of w (made in "
        "each timed call), and that copy alone; each alone in windows of ~50 ms (at most 200 "
        "runs) taken in turn 3 times, L2 emptied by a read before every run, the launch hold, "
        "CUDA events, median"
    )
    return write_results("int8-layouts", method, rows, args.out_dir)
