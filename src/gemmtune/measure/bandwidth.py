"""How fast this GPU moves memory, measured the way a benchmark of a memory-bound GEMM needs it.

A GEMM that streams its operands once (a decode batch against a weight) is judged by the bytes
it moves per second against what the GPU itself delivers, measured in the same process: a
read-only kernel (a sum over a buffer far larger than L2) and a device-to-device copy (read
and written bytes), each the median of repeated runs after warm-up. The reference is the
faster of the two, so a fraction of it is never flattered by a slow reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gemmtune.measure.timing import cuda_device, time_cuda

#: Large against every L2 (50 MB on an H100, 60 MB on an H200), small against any HBM.
BUFFER_BYTES = 2 << 30


@dataclass(frozen=True)
class MemoryBandwidth:
    read_gbps: float  # a sum over the buffer: bytes read per second
    copy_gbps: float  # a copy of the buffer: bytes read and written per second

    @property
    def reference_gbps(self) -> float:
        return max(self.read_gbps, self.copy_gbps)


def measure_bandwidth(device: int | torch.device | None = None, runs: int = 30) -> MemoryBandwidth:
    """The read and copy bandwidth of the GPU `device` (default: the current one), in GB/s."""
    device = cuda_device(device)
    with torch.cuda.device(device):
        read_ms, copy_ms = _median_ms(device, runs)
    torch.cuda.empty_cache()  # the buffers are gone with `_median_ms`'s frame
    return MemoryBandwidth(
        read_gbps=BUFFER_BYTES / (read_ms * 1e-3) / 1e9,
        copy_gbps=2 * BUFFER_BYTES / (copy_ms * 1e-3) / 1e9,
    )


def _median_ms(device: torch.device, runs: int) -> tuple[float, float]:
    source = torch.ones(BUFFER_BYTES // 2, device=device, dtype=torch.bfloat16)
    target = torch.empty_like(source)
    read = time_cuda(lambda: torch.sum(source, dtype=torch.float32), runs=runs)
    copy = time_cuda(lambda: target.copy_(source), runs=runs)
    return read.median_ms, copy.median_ms


def gemm_bytes(m: int, n: int, k: int, ab_bytes: int, out_bytes: int, l: int = 1) -> int:
    """The bytes a GEMM must move at least: A and B read once, the output written once."""
    return l * ((m * k + k * n) * ab_bytes + m * n * out_bytes)
