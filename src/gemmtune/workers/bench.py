"""The benchmark worker: the process candidates run in, so that a fault never hurts the caller.

One `BenchWorker` per GPU lives as long as the process that tunes (`gemmtune.workers`): it
imports torch and makes its CUDA context once, as it starts (while the first kernels compile),
and then serves tune after tune. A tune leases it, sets up a *runner* for its problem (the
inputs, the reference; "module:Class", so `@autotune` and tests bring their own), sends one job
at a time and releases it, which frees the problem's GPU memory.

When a candidate faults (an illegal address leaves the CUDA context unusable: the runner
reports it and the process exits), crashes the process or hangs past the limit, the parent
gets a failed `Measurement`, starts a fresh process, sets the runner up again and goes on.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from gemmtune.measure.runner import CompareJob, GemmRunner, Measurement, RunJob
from gemmtune.workers.process import HelperFailure, HelperProcess, load

log = logging.getLogger(__name__)

DEFAULT_RUNNER = "gemmtune.measure.runner:GemmRunner"
SERVICE = "gemmtune.workers.bench:BenchService"


class WorkerFailure(RuntimeError):
    """The worker could not be set up: the problem itself cannot be benchmarked."""


class BenchService:
    """The child side: a CUDA context on one GPU, and the runner of the current problem."""

    def __init__(self, device_index: int):
        import torch

        self.torch = torch
        if torch.cuda.is_available():
            torch.cuda.set_device(device_index)
            torch.empty(1, device="cuda")  # the context, made before the first job needs it
            with contextlib.suppress(ImportError):
                import tvm_ffi  # noqa: F401  loads our compiled kernels
        self.runner: Any = None
        self.runner_class: Any = GemmRunner

    def handle(self, kind: str, payload: Any) -> Any:
        if kind == "setup":
            runner_path, spec = payload
            self.runner = None
            self.runner_class = load(runner_path)
            self.runner = self.runner_class(spec)
            return None
        if kind == "release":
            self._release()
            return None
        return getattr(self.runner, payload.kind)(payload)

    def _release(self) -> None:
        self.runner = None
        gc.collect()  # tensors the runner held in reference cycles
        if self.torch.cuda.is_available():
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def poisoned(self, error: BaseException) -> bool:
        return self.runner_class.poisoned(error)


class BenchWorker:
    """A restartable benchmark process on GPU `device_index`. One tune at a time holds it
    (`lease`)."""

    def __init__(
        self,
        device_index: int = 0,
        *,
        import_main: bool = False,
        setup_timeout_s: float = 120.0,
    ):
        self.helper = HelperProcess(
            SERVICE,
            device_index,
            role="bench",
            import_main=import_main,  # the runner needs a function of the main script
            start_timeout_s=setup_timeout_s,
        )
        self.setup_timeout_s = setup_timeout_s
        self.run_timeout_s = 60.0
        self.runner: str | None = None
        self.spec: Any = None
        self.restarts = 0
        self.busy = False
        self.last_used = time.monotonic()
        self._lease = threading.Lock()

    def start(self) -> None:
        """Start the process if it is not running; returns at once."""
        if not self.helper.alive:
            self.helper.start()

    def wait_ready(self) -> None:
        """Wait for the process to have started (a failure is left for `setup` to report)."""
        with contextlib.suppress(HelperFailure):
            self.helper.wait_ready()

    @contextlib.contextmanager
    def lease(self, *, run_timeout_s: float = 60.0) -> Iterator[BenchWorker]:
        """Hold the worker for one tune, whose jobs may each run `run_timeout_s` seconds; the
        problem's GPU memory is freed at the end."""
        with self._lease:
            self.busy = True
            self.run_timeout_s = run_timeout_s
            self.start()
            try:
                yield self
            finally:
                self.release()
                self.busy = False
                self.last_used = time.monotonic()

    def setup(self, runner: str, spec: Any) -> None:
        """Build `runner` ("module:Class") on `spec` (the runner's problem description)."""
        self.runner, self.spec = runner, spec
        status, answer = self.helper.ask("setup", (runner, spec), self.setup_timeout_s)
        if status != "ok":
            if status in ("dead", "poisoned"):
                self.helper.kill()
            raise WorkerFailure(f"benchmark worker setup failed: {answer}")

    def measure(self, job: RunJob, config_key: str) -> Measurement:
        """Run one job; a failure of any kind comes back as a Measurement with an error."""
        status, answer = self._run(job, config_key)
        return answer if status == "ok" else Measurement(config_key, None, error=str(answer))

    def compare(self, job: CompareJob, config_keys: list[str]) -> list[Measurement]:
        """Time configs side by side; on a failure every one comes back with the error."""
        status, answer = self._run(job, ", ".join(config_keys))
        if status == "ok":
            return answer
        return [Measurement(key, None, error=str(answer)) for key in config_keys]

    def _run(self, job: Any, what: str) -> tuple[str, Any]:
        if not self.helper.alive:
            self.helper.start()
            self.setup(self.runner, self.spec)
        status, answer = self.helper.ask("run", job, self.run_timeout_s)
        if status in ("dead", "poisoned"):
            log.warning("benchmark worker lost on %s (%s); restarting it", what, answer)
            self.helper.kill()
            self.restarts += 1
            self.helper.start()
            self.setup(self.runner, self.spec)
        return status, answer

    def release(self) -> None:
        """Drop the runner (its tensors and the GPU memory they held); the process stays."""
        if self.helper.alive and self.runner is not None:
            self.helper.ask("release", None, self.setup_timeout_s)
        self.runner = self.spec = None

    def stop(self, idle_s: float = 0.0) -> bool:
        """Stop the process, provided no tune holds the worker and it has been idle for
        `idle_s` seconds; True if it was stopped. It starts again when next needed."""
        if not self._lease.acquire(blocking=False):
            return False
        try:
            if time.monotonic() - self.last_used < idle_s:
                return False
            self.helper.stop()
            return True
        finally:
            self._lease.release()
