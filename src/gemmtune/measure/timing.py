"""Timing device work honestly: CUDA events, warm-up by time, cold L2, median of many runs."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds per run: median and spread over `runs` timed runs."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the runs were."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms else 0.0


#: A GPU left idle (a tuner waiting for the next kernel to compile) comes back at clocks its
#: power cap will not hold, so a candidate timed soon after a pause reads faster than it runs in
#: steady use and can push better ones out of the final: after a pause, a candidate warms up
#: at least this long before it is timed (docs/tuning.md has the measurements).
IDLE_WARMUP_MS = 150.0
#: A pause longer than this counts as idle.
IDLE_AFTER_S = 0.05


def warmup_ms_after(idle_s: float, requested_ms: float) -> float:
    """How long to warm a candidate up that follows `idle_s` seconds without GPU work."""
    return max(requested_ms, IDLE_WARMUP_MS) if idle_s > IDLE_AFTER_S else requested_ms


class IdleWarmup:
    """Stretches the warm-up of a timing that follows a pause (`warmup_ms_after`): one per
    process that times candidates one after another, told when each timing ends."""

    def __init__(self) -> None:
        self.idle_since = -math.inf  # the first timing follows an idle GPU

    def warmup_ms(self, requested_ms: float) -> float:
        return warmup_ms_after(time.perf_counter() - self.idle_since, requested_ms)

    def timed(self) -> None:
        """Note that a timing just ended: the GPU is warm."""
        self.idle_since = time.perf_counter()

    def warm(self, fn: Callable[[], object]) -> None:
        """Run `fn` for `IDLE_WARMUP_MS` of device time now (while the tuner waits for its
        first kernel, say), so that a timing that follows at once needs no long warm-up."""
        _warm_up([fn], IDLE_WARMUP_MS)
        self.timed()


def cuda_device(device: torch.device | int | None = None) -> torch.device:
    """`device` as a torch.device: a CUDA index, a device, or None for the current one."""
    if device is None:
        device = torch.cuda.current_device()
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


class L2Flusher:
    """Evicts the GPU's L2 by reading a buffer twice its size, so every timed run reads its
    inputs from HBM.

    Reading, not writing (as `triton.testing.do_bench` does): a written buffer leaves the L2
    full of dirty lines, and the timed kernel then pays for writing them back to HBM. A kernel
    that reads less than the L2 holds (a decode GEMM streaming a 30-100 MB weight) would move
    up to twice its own bytes and look half as fast as it runs after another kernel.
    """

    def __init__(self, device: torch.device | int | None = None):
        device = cuda_device(device)
        props = torch.cuda.get_device_properties(device)
        size = max(2 * getattr(props, "L2_cache_size", 64 << 20), 64 << 20)
        # float32: torch sums it at 3.4 TB/s on an H200, an int32 buffer (int64 sum) at 0.7
        self.buffer = torch.zeros(size // 4, dtype=torch.float32, device=device)
        self.total = torch.zeros((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        torch.sum(self.buffer, dim=0, out=self.total)


def _timing(times: list[float]) -> Timing:
    times = sorted(times)
    deciles = statistics.quantiles(times, n=10) if len(times) > 1 else [times[0]] * 9
    return Timing(statistics.median(times), deciles[0], deciles[-1], len(times))


def _warm_up(fns: list[Callable[[], object]], warmup_ms: float) -> tuple[float, float]:
    """Run `fns` in turn for at least `warmup_ms` of device time; returns the device ms of one
    turn and the host ms one turn takes to launch."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for fn in fns:
        fn()
    torch.cuda.current_stream().synchronize()
    warm, host_s, turns = 0.0, 0.0, 0
    while warm < warmup_ms or turns == 0:
        start.record()
        launched = time.perf_counter()
        for _ in range(5):
            for fn in fns:
                fn()
        host_s += time.perf_counter() - launched
        stop.record()
        stop.synchronize()
        warm += start.elapsed_time(stop)
        turns += 5
    return warm / turns, host_s * 1e3 / turns


#: Cycles per microsecond the hold counts with: about the top SM clock of the GPUs served
#: (1.98 GHz on an H100 or H200), so at lower clocks a hold lasts longer, never shorter.
HOLD_CYCLES_PER_US = 2000
#: Host time a run spends besides `fn` (the flush, the hold, two events) on a slow host.
HOLD_MARGIN_US = 25.0


class LaunchHold:
    """Keeps the GPU busy, after the flush and before a timed run's first event, for longer
    than the host takes to launch the run.

    A timed run is `start.record(); fn(); stop.record()`: if the GPU reaches `start` before the
    host has launched `fn`, the events time the host's launch path as well as the kernel, and
    a 10-30 µs kernel behind a 15 µs launch (torch._scaled_mm, or any call with Python in it
    on a slow host) reads up to twice its time, by chance from run to run. A spin kernel
    (`torch.cuda._sleep`) of the host's launch time plus a margin, queued after the flush, lets
    the host get ahead, so every timed kernel is already queued when its `start` is reached,
    as kernels are back to back in a model. It moves no memory: the flushed L2 stays cold."""

    def __init__(self, host_ms_per_call: float):
        hold_us = min(host_ms_per_call * 1e3 + HOLD_MARGIN_US, 1000.0)
        self.cycles = int(hold_us * HOLD_CYCLES_PER_US)

    def __call__(self) -> None:
        torch.cuda._sleep(self.cycles)


def _event_pairs(count: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    """Timing events made before a timed loop, so that the loop only launches."""
    return [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(count)
    ]


def _timed_call(
    fn: Callable[[], object],
    flush: Callable[[], None] | None,
    hold: LaunchHold,
    events: tuple[torch.cuda.Event, torch.cuda.Event],
) -> None:
    """Flush and hold (outside the timed region), then launch `fn` between the two events."""
    if flush is not None:
        flush()
    hold()
    events[0].record()
    fn()
    events[1].record()


def as_graph(fn: Callable[[], object]) -> Callable[[], None]:
    """`fn` captured once in a CUDA graph; the result replays it. Replays skip the host's launch
    path, which is what a caller that captures its model in a graph sees."""
    fn()  # load and initialise outside the capture
    torch.cuda.current_stream().synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_side_by_side(
    fns: list[Callable[[], object]],
    *,
    warmup_ms: float = 25.0,
    runs: int = 100,
    flush: Callable[[], None] | None = None,
    graph: bool = False,
) -> list[Timing]:
    """Time several functions run by run in turn (a, b, c, a, b, c, ...), so that every one
    meets the same clocks and temperature: the fair way to compare contenders. With `graph`
    each function is captured in a CUDA graph and replayed (`as_graph`)."""
    if graph:
        fns = [as_graph(fn) for fn in fns]
    _, host_ms = _warm_up(fns, warmup_ms)
    hold = LaunchHold(host_ms)  # a whole turn's launches: it outlasts the slowest contender's
    events = [_event_pairs(len(fns)) for _ in range(runs)]
    for run in events:
        for fn, pair in zip(fns, run, strict=True):
            _timed_call(fn, flush, hold, pair)
    torch.cuda.current_stream().synchronize()
    return [_timing([run[i][0].elapsed_time(run[i][1]) for run in events]) for i in range(len(fns))]


def time_in_windows(
    fns: list[Callable[[], object]],
    *,
    window_ms: float = 50.0,
    rounds: int = 3,
    warmup_ms: float = 10.0,
    max_runs: int = 2000,
    flush: Callable[[], None] | None = None,
    graph: bool = False,
    rotate: bool = False,
) -> list[Timing]:
    """Time each function alone, in windows of about `window_ms` of its own device time, the
    functions taken in turn `rounds` times; each one's Timing is over all its windows' runs.
    With `rotate`, round r starts at the r-th function, so that no function always follows
    the same one (the windows before a window set the clocks it starts at).

    A GPU at its power cap sets its clocks from the power of what it ran over the last
    milliseconds. Run by run in turn (`time_side_by_side`), contenders share the clocks of
    their mix, so one that spends more energy per FLOP looks faster than it is when run alone,
    as a caller runs it. In windows each runs at its own clocks; taking turns keeps slow drifts
    (temperature) from favouring one."""
    if graph:
        fns = [as_graph(fn) for fn in fns]
    times: list[list[float]] = [[] for _ in fns]
    for round_ in range(rounds):
        start = round_ % len(fns) if rotate else 0
        for i in [*range(start, len(fns)), *range(start)]:
            fn, measured = fns[i], times[i]
            per_run, host_ms = _warm_up([fn], warmup_ms)
            hold = LaunchHold(host_ms)
            runs = max(1, min(max_runs, math.ceil(window_ms / max(per_run, 1e-3))))
            events = _event_pairs(runs)
            for pair in events:
                _timed_call(fn, flush, hold, pair)
            torch.cuda.current_stream().synchronize()
            measured.extend(begin.elapsed_time(end) for begin, end in events)
    return [_timing(t) for t in times]


def time_cuda(
    fn: Callable[[], object],
    *,
    warmup_ms: float = 25.0,
    runs: int = 100,
    flush: Callable[[], None] | None = None,
    graph: bool = False,
) -> Timing:
    """Time `fn` (which launches work on the current stream) with CUDA events.

    Warm-up lasts at least `warmup_ms` of device time; then each of `runs` runs is timed on
    its own, after `flush` (outside the timed region) when one is given; with `graph`, as
    replays of a CUDA graph.
    """
    return time_side_by_side([fn], warmup_ms=warmup_ms, runs=runs, flush=flush, graph=graph)[0]
