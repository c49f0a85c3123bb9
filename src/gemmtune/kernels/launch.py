"""Launching a compiled kernel: its runtime arguments and its split-K/stream-K workspace.

The workspace (fp32 partial tiles and int32 arrival counters, `reduction.py`) is allocated
once per device and stream, grown when a launch needs more, and reused: kernels leave every
counter at 0, so a launch needs no memset. Launches on one stream run in order, so they can
share it. A launch being captured in a CUDA graph gets a workspace of its own instead
(`WorkspacePool.get`), its counters from a set-aside run that no replay needs to zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import tvm_ffi

from gemmtune.core.config import GemmConfig
from gemmtune.kernels import tile_k
from gemmtune.kernels.build import CompiledGemm, runtime_args
from gemmtune.kernels.schedule_model import TileGrid, ceil_div, make_schedule


@dataclass(frozen=True)
class WorkspaceNeed:
    """What one launch needs: fp32 partial-tile elements and int32 counters."""

    partials: int
    counters: int

    @property
    def bytes(self) -> int:
        return 4 * (self.partials + self.counters)


def workspace_need(
    config: GemmConfig,
    m: int,
    n: int,
    k: int,
    l: int,
    max_active_clusters: int,
    ab_bytes: int = 2,
) -> WorkspaceNeed:
    """The workspace `config` needs for an (m, n, k, l) problem of `ab_bytes`-byte inputs, from
    the schedule model."""
    grid = TileGrid.of(config, m, n, l)
    schedule = make_schedule(
        config.decomposition.value,
        grid,
        ceil_div(k, tile_k(config, ab_bytes)),
        max_active_clusters,
        splits=config.splits,
    )
    ctas = config.cluster_m * config.cluster_n  # slots and counters are per CTA
    cta_tile = config.tile_m // config.cta_group * config.tile_n
    return WorkspaceNeed(schedule.partial_slots * ctas * cta_tile, schedule.counters * ctas)


def capturing(device: torch.device) -> bool:
    """Whether work on `device`'s current stream is being captured into a CUDA graph."""
    if device.type != "cuda":
        return False
    if device.index is None or device.index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


#: Counters set aside, per device, for launches captured in CUDA graphs (4 MB): each captured
#: launch that counts takes its own run of them for good, zeroed once, never filled in a replay
CAPTURE_COUNTERS = 1 << 20


@dataclass
class CaptureCounters:
    """Zeroed counters that captured launches take runs of and never give back.

    A run taken by a graph's launch must keep its address as long as the graph may replay,
    and nothing tells when that ends, so runs are not reused; the kernels leave them at zero
    after every replay. Allocated outside any capture (by a launch that is not captured), so
    a capture only takes from it."""

    counters: torch.Tensor
    taken: int = 0

    def take(self, count: int) -> torch.Tensor | None:
        """A run of `count` zeroed counters, 16-byte aligned, or None when too few are left."""
        begin = -(-self.taken // 4) * 4
        if begin + count > self.counters.numel():
            return None
        self.taken = begin + count
        return self.counters[begin : begin + count]


@dataclass
class WorkspacePool:
    """One growing workspace per (device, stream), and counters for captured launches."""

    buffers: dict = field(default_factory=dict)
    capture_counters: dict = field(default_factory=dict)

    def get(self, device: torch.device, need: WorkspaceNeed) -> tuple[torch.Tensor, torch.Tensor]:
        """(partials, counters) of at least the sizes `need` asks for; counters are all zero.

        A launch being captured in a CUDA graph gets buffers of its own: a replay writes to
        the addresses the capture saw, so a shared buffer would have to outlive every graph
        that ever used it, yet growing drops it (its memory then goes to other tensors, or
        back to the driver once the graph whose capture allocated it is gone, and the replays
        of graphs still using it write there: an illegal address, or another tensor's values).
        Its partials are allocated in the capture, from the graph's private pool, which holds
        them as long as the graph. Its counters are a run of `CaptureCounters`; once those are
        spent (or where no launch outside a capture has counted on this device yet) they too
        come from the graph's pool, and the graph zeroes them at each replay, a fill kernel of
        its own in every replay, about 1 µs beside an 8 µs decode GEMM. A launch that counts
        nothing (data-parallel) gets counters that are never filled."""
        if capturing(device):
            return _new_partials(device, need), self._captured_counters(device, need)
        if need.counters and device not in self.capture_counters:
            counters = torch.zeros(CAPTURE_COUNTERS, dtype=torch.int32, device=device)
            self.capture_counters[device] = CaptureCounters(counters)
        key = (device, torch.cuda.current_stream(device).stream_id)
        partials, counters = self.buffers.get(key, (None, None))
        # each grows on its own, so configs that need more of one and less of the other can
        # alternate without reallocating
        if partials is None or partials.numel() < need.partials:
            partials = _new_partials(device, need)
        if counters is None or counters.numel() < need.counters:
            counters = _new_counters(device, need)
        self.buffers[key] = (partials, counters)
        return partials, counters

    def _captured_counters(self, device: torch.device, need: WorkspaceNeed) -> torch.Tensor:
        if not need.counters:
            return _unused_counters(device)
        arena = self.capture_counters.get(device)
        run = arena.take(need.counters) if arena is not None else None
        return run if run is not None else _new_counters(device, need)


def _new_partials(device: torch.device, need: WorkspaceNeed) -> torch.Tensor:
    return torch.empty(max(need.partials, 4), dtype=torch.float32, device=device)


def _new_counters(device: torch.device, need: WorkspaceNeed) -> torch.Tensor:
    return torch.zeros(max(need.counters, 4), dtype=torch.int32, device=device)


def _unused_counters(device: torch.device) -> torch.Tensor:
    """Counters for a launch whose schedule counts nothing: never read, so never filled."""
    return torch.empty(4, dtype=torch.int32, device=device)


WORKSPACES = WorkspacePool()


def launch_args(
    config: GemmConfig,
    device: torch.device,
    m: int,
    n: int,
    k: int,
    l: int,
    pool: WorkspacePool = WORKSPACES,
    ab_bytes: int = 2,
) -> tuple:
    """Everything a launch of `config`'s kernel passes after (a, b, out) for an (m, n, k, l)
    problem of `ab_bytes`-byte inputs: the workspace and the runtime arguments. Found once per
    problem by its callers.
    The workspace is handed over as TVM-FFI tensors (which keep the torch tensors alive): a
    launch then skips converting two tensors, a measurable part of a small problem's call."""
    args = runtime_args(config, device.index or 0)
    need = workspace_need(config, m, n, k, l, args[-1], ab_bytes)
    partials, counters = pool.get(device, need)
    return (tvm_ffi.from_dlpack(partials), tvm_ffi.from_dlpack(counters), *args)


def kernel_scales(scales: tuple) -> tuple:
    """The scales of a scaled (fp8) product as its kernel takes them: `torch._scaled_mm`'s
    (one element each, or (m, 1) and (1, n)) as 1-D fp32 tensors; () stays ()."""
    return tuple(s if s.dim() == 1 else s.reshape(-1) for s in scales)


def launch(
    kernel: CompiledGemm,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    config: GemmConfig | None = None,
    pool: WorkspacePool = WORKSPACES,
    scales: tuple = (),
    bias: torch.Tensor | None = None,
) -> None:
    """Run `kernel` on torch tensors with the runtime arguments of `config` (by default the
    config it was compiled from), on torch's current stream; a scaled (fp8) kernel with
    `scales` as `torch._scaled_mm` takes them, a kernel of a signature with a bias with
    `bias` (1-D, one element per column of `out`, in its type)."""
    batch = a.shape[0] if a.dim() == 3 else 1
    args = launch_args(
        config or kernel.config,
        a.device,
        a.shape[-2],
        b.shape[-1],
        a.shape[-1],
        batch,
        pool,
        a.element_size(),
    )
    biases = () if bias is None else (bias,)
    kernel(a, b, out, *kernel_scales(scales), *biases, *args)
