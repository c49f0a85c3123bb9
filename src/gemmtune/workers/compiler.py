"""Compile workers: processes that import the DSL once and compile kernels for every tune.

A `CompilePool` holds up to `max_workers` helper processes for one target (`CUTE_DSL_ARCH`),
started on first need (`reserve`: they import the DSL while the tuner ranks its candidates)
and kept for the next tune. Each compiles a kernel and writes it under the kernel cache's file
name (`kernels.build.artifact_name`) with an atomic rename, so a tune fills the kernel cache and
the next one compiles nothing that is already there (`compile_iter(reuse=True)`).

A compile worker never imports torch: nothing it does touches a tensor, and torch's import
(which `tvm_ffi` attempts) would lengthen every worker's start for nothing. A compile that
fails is reported; one that crashes its worker or outlives `timeout_s` costs that worker,
which is replaced.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemmtune.core.config import GemmConfig
from gemmtune.core.files import write_atomically
from gemmtune.kernels.build import artifact_name
from gemmtune.kernels.signature import KernelSignature
from gemmtune.workers.process import HelperProcess

log = logging.getLogger(__name__)

WORKERS_ENV = "GEMMTUNE_COMPILE_WORKERS"
SERVICE = "gemmtune.workers.compiler:CompileService"


@dataclass(frozen=True)
class CompileJob:
    config: GemmConfig
    signature: KernelSignature

    @property
    def name(self) -> str:
        return Path(self.file_name).stem

    @property
    def file_name(self) -> str:
        return artifact_name(self.config, self.signature)

    def payload(self) -> tuple[str, dict]:
        return self.config.to_json(), dataclasses.asdict(self.signature)


@dataclass(frozen=True)
class CompileOutcome:
    job: CompileJob
    path: Path | None
    compile_s: float
    error: str | None = None
    cached: bool = False  # the kernel cache held the binary: nothing was compiled


class CompileError(RuntimeError):
    """A compile failed, or its worker died or hung."""


class CompileService:
    """The child side: compiles for one target, the DSL imported once."""

    def __init__(self, target: str):
        os.environ["CUTE_DSL_ARCH"] = target
        sys.modules.setdefault("torch", None)  # see the module's docstring
        from gemmtune.kernels.build import import_compiler

        import_compiler(target)

    def handle(self, kind: str, payload: Any) -> Any:
        from gemmtune.kernels import build

        config_json, signature = payload[:2]
        config = GemmConfig.from_json(config_json)
        sig = KernelSignature(**signature)
        if kind == "inspect":
            return build.inspect_gemm(config, sig)
        kernel = build.compile_gemm(config, sig)
        path = Path(payload[2]) / artifact_name(config, sig)
        write_atomically(path, lambda tmp: build.export_gemm(kernel, tmp))
        return str(path), kernel.compile_s

    @staticmethod
    def poisoned(error: BaseException) -> bool:
        return False


def default_workers(tunes: int = 1) -> int:
    """`GEMMTUNE_COMPILE_WORKERS`, else one per core but one, at most 8 for each of `tunes`
    tunes at once (a tune compiles at most its top 8 binaries)."""
    if os.environ.get(WORKERS_ENV):
        return max(1, int(os.environ[WORKERS_ENV]))
    return max(1, min(8 * tunes, (os.cpu_count() or 2) - 1))


@dataclass
class _Worker:
    helper: HelperProcess
    stopping: threading.Event = field(default_factory=threading.Event)


class CompilePool:
    """Compile workers for one target, shared by every tune of the process (thread-safe)."""

    def __init__(
        self,
        target: str,
        *,
        max_workers: int | None = None,
        timeout_s: float = 300.0,
        service: str = SERVICE,
    ):
        self.target = target
        self.service = service
        self.max_workers = max_workers or default_workers()
        self.timeout_s = timeout_s
        self.last_used = time.monotonic()
        self._queue: queue.Queue = queue.Queue()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._outstanding = 0

    @property
    def workers(self) -> int:
        return len(self._workers)

    def allow(self, tunes: int) -> None:
        """Let the pool grow to serve `tunes` tunes at once (`default_workers`)."""
        with self._lock:
            self.max_workers = max(self.max_workers, default_workers(tunes))

    def reserve(self, count: int) -> None:
        """Have at least `count` workers (at most `max_workers`) started; returns at once."""
        with self._lock:
            while len(self._workers) < min(count, self.max_workers):
                helper = HelperProcess(
                    self.service, self.target, role="compile", dsl_target=self.target
                )
                worker = _Worker(helper)
                worker.helper.start()
                self._workers.append(worker)
                threading.Thread(target=self._drive, args=(worker,), daemon=True).start()

    def submit(self, job: CompileJob, out_dir: Path) -> Future:
        """Compile `job` into `out_dir`: a future of its `CompileOutcome`."""
        return self._submit("compile", (*job.payload(), str(out_dir)), job)

    def inspect(self, job: CompileJob) -> Future:
        """`kernels.build.inspect_gemm` of `job` in a worker: a future of its `BinaryReport`."""
        return self._submit("inspect", job.payload(), job)

    def _submit(self, kind: str, payload: tuple, job: CompileJob) -> Future:
        future: Future = Future()
        with self._lock:
            self._outstanding += 1
        future.add_done_callback(self._done)
        self._queue.put((kind, payload, job, future))
        self.reserve(1)
        return future

    def _done(self, _: Future) -> None:
        with self._lock:
            self._outstanding -= 1
            self.last_used = time.monotonic()

    def _drive(self, worker: _Worker) -> None:
        """One worker's thread: take a request, wait for its answer, replace a lost process."""
        helper = worker.helper
        while not worker.stopping.is_set():
            try:
                kind, payload, job, future = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if not future.set_running_or_notify_cancel():
                continue
            start = time.perf_counter()
            status, answer = helper.ask(kind, payload, self.timeout_s)
            if status == "dead":
                log.warning("compile worker lost on %s (%s); starting another", job.name, answer)
                helper.start()
            if status != "ok":
                future.set_exception(CompileError(answer))
            elif kind == "compile":
                path, seconds = answer
                future.set_result(CompileOutcome(job, Path(path), seconds))
            else:
                future.set_result(answer)
            log.debug("%s %s: %s in %.2f s", kind, job.name, status, time.perf_counter() - start)
        helper.stop()

    def stop_workers(self, idle_s: float = 0.0) -> bool:
        """Stop every worker (each after its current request), provided nothing is queued or
        running and the pool has been idle for `idle_s` seconds; True if they were stopped.
        Workers start again on the next request."""
        with self._lock:
            if self._outstanding or time.monotonic() - self.last_used < idle_s:
                return False
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.stopping.set()
            if sys.is_finalizing():
                worker.helper.kill()
        return True


def compile_iter(
    jobs: list[CompileJob], out_dir: Path, pool: CompilePool, *, reuse: bool = True
) -> Iterator[CompileOutcome]:
    """Compile `jobs` into `out_dir` in `pool`'s workers, yielding each outcome as it
    completes (so the caller can benchmark while the rest compile); failures are yielded, not
    raised. With `reuse`, a binary `out_dir` already holds is yielded first, compiled by
    nobody."""
    out_dir.mkdir(parents=True, exist_ok=True)
    held = [job for job in jobs if reuse and (out_dir / job.file_name).exists()]
    pool.reserve(len(jobs) - len(held))
    futures = {pool.submit(job, out_dir): job for job in jobs if job not in held}
    try:
        for job in held:
            yield CompileOutcome(job, out_dir / job.file_name, 0.0, cached=True)
        for future in as_completed(futures):
            job = futures[future]
            try:
                yield future.result()
            except CompileError as exc:
                log.warning("compile of %s failed: %s", job.name, exc)
                yield CompileOutcome(job, None, 0.0, str(exc))
    finally:
        for future in futures:
            future.cancel()


def compile_all(
    jobs: list[CompileJob], out_dir: Path, pool: CompilePool, *, reuse: bool = True
) -> list[CompileOutcome]:
    """Compile `jobs` into `out_dir`; failures are reported, not raised."""
    return list(compile_iter(jobs, out_dir, pool, reuse=reuse))


def inspect_all(jobs: list[CompileJob], pool: CompilePool) -> list:
    """`kernels.build.inspect_gemm` for every job, in parallel, in job order."""
    pool.reserve(len(jobs))
    return [future.result() for future in [pool.inspect(job) for job in jobs]]
