"""The process's helper processes: compile workers and benchmark workers, shared by every tune.

Every `tune()`, every `@autotune` tuning and every kernel-cache miss uses the same helpers:
`compile_pool(target)` (processes that import the DSL once) and `bench_worker(device)` (a
process with a CUDA context on that GPU). They start on first need, are replaced after a
fault, stop when they have been idle for `GEMMTUNE_WORKER_IDLE_S` seconds (default 300: each
compile worker holds the DSL in memory, the benchmark worker a CUDA context) and at exit. The
second tune of a process therefore pays no process start, no DSL or torch import and no CUDA
context.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: a compile worker imports this package, never torch
    from gemmtune.workers.bench import BenchWorker
    from gemmtune.workers.compiler import CompilePool

IDLE_ENV = "GEMMTUNE_WORKER_IDLE_S"
DEFAULT_IDLE_S = 300.0

_lock = threading.Lock()
_compile_pools: dict[str, CompilePool] = {}
_bench_workers: dict[tuple[int, bool], BenchWorker] = {}
_reaper: threading.Thread | None = None


def idle_limit_s() -> float:
    """How long helpers may sit idle before they are stopped (`GEMMTUNE_WORKER_IDLE_S`;
    0 or less: never)."""
    value = float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S))
    return value if value > 0 else math.inf


def compile_pool(target: str) -> CompilePool:
    """The compile workers for `target` (e.g. "sm_90a"), created on first use."""
    from gemmtune.workers.compiler import CompilePool

    with _lock:
        pool = _compile_pools.get(target)
        if pool is None:
            pool = _compile_pools[target] = CompilePool(target)
            _watch()
        return pool


def bench_worker(device_index: int, *, import_main: bool = False) -> BenchWorker:
    """The benchmark worker of GPU `device_index` (one that imports the main script, for
    `@autotune` functions defined there, with `import_main`), created on first use."""
    from gemmtune.workers.bench import BenchWorker

    with _lock:
        worker = _bench_workers.get((device_index, import_main))
        if worker is None:
            worker = BenchWorker(device_index, import_main=import_main)
            _bench_workers[device_index, import_main] = worker
            _watch()
        return worker


def start(device_index: int | None = None, *, tunes: int = 1) -> None:
    """Start the helpers a first tune on GPU `device_index` (default: the current one) needs,
    and return at once: a server that calls this as it starts pays nothing for them when its
    first new bucket tunes. `tunes`: how many tunes will run at once (one per GPU of a
    pretune), each compiling its own binaries. Nothing is started where no GPU our kernels
    serve is present."""
    import torch

    from gemmtune.core.device import Arch, arch_of

    if not torch.cuda.is_available():
        return
    index = torch.cuda.current_device() if device_index is None else device_index
    if arch_of(index) is Arch.OTHER:
        return
    bench_worker(index).start()
    pool = compile_pool(arch_of(index).compile_target)
    pool.allow(tunes)
    pool.reserve(8 * tunes)


def shutdown() -> None:
    """Stop every helper process now (they start again when next needed)."""
    with _lock:
        pools, workers = list(_compile_pools.values()), list(_bench_workers.values())
    for pool in pools:
        pool.stop_workers()
    for worker in workers:
        worker.stop()


def _watch() -> None:
    """Start the thread that stops idle helpers (once; called holding `_lock`)."""
    global _reaper
    if _reaper is None:
        _reaper = threading.Thread(target=_reap_idle, name="gemmtune-reaper", daemon=True)
        _reaper.start()
        atexit.register(shutdown)


def _reap_idle() -> None:
    while True:
        limit = idle_limit_s()
        time.sleep(min(30.0, limit / 4) if math.isfinite(limit) else 30.0)
        with _lock:
            pools, workers = list(_compile_pools.values()), list(_bench_workers.values())
        for pool in pools:
            pool.stop_workers(idle_s=limit)
        for worker in workers:
            worker.stop(idle_s=limit)
