"""How long a GPU runs fast after a pause: what `bench.timing.IdleWarmup` must wait out.

A GPU at its power cap that sat idle comes back at clocks it cannot hold. For each pause
length, a large bf16 GEMM (torch.mm, 8192 x 8192 x 8192, `torch.randn` inputs) first runs
steadily for 1 s, then the GPU idles for the pause, then 60 runs are timed one by one with CUDA
events (L2 flushed before each). Each run's time is given against the steady time (the median
of the last 20 runs); `recovered_ms` is the device time from the end of the pause to the first
run after which every run stays within 1 % of steady.

    python benchmarks/bench_idle_warmup.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_results

from gemmtune.bench.timing import L2Flusher

PAUSES_MS = (0, 10, 25, 50, 100, 200, 500, 2000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flush = L2Flusher()
    rows = []
    for pause_ms in PAUSES_MS:
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:  # steady use
            for _ in range(20):
                torch.mm(a, b)
            torch.cuda.synchronize()
        time.sleep(pause_ms / 1e3)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(60)
        ]
        for begin, end in events:
            flush()
            begin.record()
            torch.mm(a, b)
            end.record()
        torch.cuda.synchronize()
        times = [begin.elapsed_time(end) for begin, end in events]
        steady = statistics.median(times[-20:])
        recovered, elapsed = 0.0, 0.0
        for i, t in enumerate(times):
            elapsed += t
            if all(abs(u / steady - 1) <= 0.01 for u in times[i:]):
                break
            recovered = elapsed
        rows.append(
            {
                "pause_ms": pause_ms,
                "steady_ms": round(steady, 4),
                "first_runs_vs_steady": [round(t / steady, 4) for t in times[:12]],
                "recovered_ms": round(recovered, 1),
            }
        )
        print(
            f"pause {pause_ms:5d} ms: recovered after {recovered:6.1f} ms; first runs "
            f"{' '.join(f'{t / steady:.3f}' for t in times[:8])}",
            flush=True,
        )
    path = write_results(
        "idle-warmup", __doc__.split("\n\n")[1].replace("\n", " "), rows, args.out_dir
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
