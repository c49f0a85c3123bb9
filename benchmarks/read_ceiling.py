"""The read ceiling: how fast this GPU reads a decode batch's weight, timed as the serving suite
times GEMMs.

A decode GEMM (a few rows against a weight) is judged by its `bw_fraction`: the bytes it moves
per second over what a 2 GiB read or copy reaches (`gemmtune.measure.bandwidth`). A read of
tens of MB does not reach the 2 GiB rate, whoever does it: the time from the first event to
the first bytes, the ramp of requests in flight and the last wave's drain are paid once per
kernel. This suite measures that ceiling for every weight size of the serving suite's decode
rows, with the timing the serving rows get (`gemmtune.measure.timing.time_in_windows`: the L2
emptied by a read before every run, the launch hold, windows taken in turn, median):

- `sum`: `torch.sum` of the weight into fp32 (what `measure.bandwidth` times over 2 GiB);
- `copy`: a copy of the weight (read and written bytes);
- `stream`: a Triton kernel that only reads, each program 16 KB in 16-byte loads, summed to
  one float per program (where triton is installed);
- `empty`: a one-element kernel, the time any kernel costs between two events.

Rows: `weight` (the serving shapes' projection, e.g. "l8b_o"), `bytes`, `contender`, `ms`,
`gbps` (bytes read per second; a copy's read and written), `bw_fraction` (of the 2 GiB
reference measured in the same run).

    python -m benchmarks read-ceiling --out-dir DIR
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import RESULTS, write_results
from gemmtune.cli.bench import load_shape_suite

SUITE_HELP = "how fast the GPU reads each decode weight of the serving suite, timed as GEMMs are"

#: elements of a 16-bit weight that one program of the Triton read kernel loads (16 KB)
STREAM_BLOCK = 8192


def decode_weights(max_m: int = 64) -> dict[str, tuple[int, int]]:
    """The weights the serving suite's decode rows (m <= `max_m`) read, by projection name
    ("l8b_o" for l8b_o_m1 ... l8b_o_m64): their (k, n)."""
    weights: dict[str, tuple[int, int]] = {}
    for shape in load_shape_suite(suite="serving"):
        if shape["kind"] == "decode" and shape["m"] <= max_m:
            weights.setdefault(shape["name"].rsplit("_m", 1)[0], (shape["k"], shape["n"]))
    return weights


def stream_reader() -> Callable | None:
    """A function that reads a 1-D 16-bit tensor with a Triton kernel that only reads, into a
    given fp32 buffer of one value per program; None where triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def read_kernel(source, partials, numel, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(source + offsets, mask=offsets < numel, other=0.0)
        tl.store(partials + tl.program_id(0), tl.sum(values.to(tl.float32), axis=0))

    def read(source, partials) -> None:
        read_kernel[(partials.numel(),)](source, partials, source.numel(), BLOCK=STREAM_BLOCK)

    return read


def contenders(
    weight, partials, copy_target, sink, total, read: Callable | None = None
) -> dict[str, Callable[[], object]]:
    """The reads of `weight` this suite times, by name; `read` (a `stream_reader()`) adds the
    Triton read."""
    import torch

    fns: dict[str, Callable[[], object]] = {
        "sum": lambda: torch.sum(weight, dim=0, dtype=torch.float32, out=total),
        "copy": lambda: copy_target.copy_(weight),
        "empty": lambda: sink.add_(1.0),
    }
    if read is not None:
        fns["stream"] = lambda: read(weight, partials)
    return fns


def bytes_moved(contender: str, weight_bytes: int) -> int:
    """The bytes a contender moves for a weight of `weight_bytes`: a copy reads and writes."""
    return {"copy": 2 * weight_bytes, "empty": 0}.get(contender, weight_bytes)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks read-ceiling", description=SUITE_HELP
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--window-ms", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from gemmtune.measure.bandwidth import measure_bandwidth
    from gemmtune.measure.timing import L2Flusher, time_in_windows

    device = torch.device("cuda", torch.cuda.current_device())
    reference = measure_bandwidth(device)
    flush = L2Flusher(device)
    sink = torch.zeros(1, device=device)
    total = torch.zeros((), device=device)
    read = stream_reader()
    rows = []
    for name, (k, n) in sorted(decode_weights().items(), key=lambda item: item[1][0] * item[1][1]):
        weight = torch.randn(k * n, device=device, dtype=torch.bfloat16)
        partials = torch.empty(-(-weight.numel() // STREAM_BLOCK), device=device)
        copy_target = torch.empty_like(weight)
        fns = contenders(weight, partials, copy_target, sink, total, read)
        timings = time_in_windows(
            list(fns.values()), window_ms=args.window_ms, rounds=args.rounds, flush=flush
        )
        weight_bytes = weight.numel() * weight.element_size()
        for contender, timing in zip(fns, timings, strict=True):
            moved = bytes_moved(contender, weight_bytes)
            gbps = moved / (timing.median_ms * 1e-3) / 1e9
            rows.append(
                {
                    "weight": name,
                    "k": k,
                    "n": n,
                    "bytes": weight_bytes,
                    "contender": contender,
                    "ms": round(timing.median_ms, 5),
                    "spread": round(timing.spread, 3),
                    "gbps": round(gbps, 1),
                    "bw_fraction": round(gbps / reference.reference_gbps, 3),
                }
            )
            print(
                f"{name:10s} {weight_bytes / 1e6:7.1f} MB {contender:6s} "
                f"{timing.median_ms * 1e3:8.2f} us {gbps:7.0f} GB/s "
                f"{gbps / reference.reference_gbps:5.2f}",
                flush=True,
            )
        del weight, partials, copy_target
    method = (
        "each decode weight of the serving suite (bf16, torch.randn) read by each contender, "
        "timed by gemmtune.measure.timing.time_in_windows: windows of "
        f"~{args.window_ms:g} ms taken in turn {args.rounds} times, the L2 emptied by a read "
        "before every run, the launch hold, CUDA events, median; bw_fraction of the GPU's "
        f"memory bandwidth {reference.__dict__} (measure.bandwidth: a sum and a copy over "
        "2 GiB, the faster the reference)"
    )
    return write_results("read-ceiling", method, rows, args.out_dir)
