"""Benchmarking in a separate process, so that a faulting candidate never hurts the caller.

A `BenchWorker` owns a spawned (not forked) process, which owns the GPU context in which
candidates run. The parent sends it the problem once, then one job at a time, and waits for
each answer with a time limit. When a candidate faults (an illegal address leaves the CUDA
context unusable: the runner reports it and the process exits), crashes the process or hangs
past the limit, the parent gets a failed `Measurement`, kills what is left of the process,
starts a fresh one, sets the problem up again and goes on.

The runner is named by an import path ("module:Class"), so tests can swap in their own.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
from typing import Any

from gemmtune.bench.runner import CompareJob, Measurement, RunJob
from gemmtune.processes import main_script_hidden

log = logging.getLogger(__name__)

DEFAULT_RUNNER = "gemmtune.bench.runner:GemmRunner"
EXIT_POISONED = 3


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _serve(conn, runner_path: str, env: dict[str, str]) -> None:
    """The worker process: build the runner on "setup", answer "run" jobs until "stop"."""
    os.environ.update(env)
    runner_class = _load(runner_path)
    runner = None
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        try:
            if kind == "setup":
                runner = runner_class(payload)
                conn.send(("ok", None))
            else:
                conn.send(("ok", getattr(runner, payload.kind)(payload)))
        except Exception as exc:  # the candidate's failure, reported to the parent
            poisoned = runner_class.poisoned(exc)
            conn.send(("poisoned" if poisoned else "error", f"{type(exc).__name__}: {exc}"))
            if poisoned:
                os._exit(EXIT_POISONED)


class WorkerFailure(RuntimeError):
    """The worker could not be set up: the problem itself cannot be benchmarked."""


class BenchWorker:
    """A restartable benchmark process. Use as a context manager."""

    def __init__(
        self,
        runner: str = DEFAULT_RUNNER,
        *,
        setup_timeout_s: float = 120.0,
        run_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
        import_main: bool = False,
    ):
        self.runner = runner
        self.import_main = import_main  # the runner needs a function of the main script
        self.setup_timeout_s = setup_timeout_s
        self.run_timeout_s = run_timeout_s
        self.env = env or {}
        self.spec: Any = None
        self.process = None
        self.conn = None
        self.restarts = 0

    def __enter__(self) -> BenchWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, self.runner, self.env), daemon=True
        )
        with contextlib.nullcontext() if self.import_main else main_script_hidden():
            self.process.start()
        child.close()

    def _kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None

    def _ask(self, kind: str, payload: Any, timeout: float) -> tuple[str, Any]:
        """Send a message; the answer, or ("dead", why) when the process died or hung."""
        try:
            self.conn.send((kind, payload))
            if not self.conn.poll(timeout):
                return "dead", f"no answer within {timeout:.0f} s (hung)"
            return self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.process.join(timeout=10)
            return "dead", f"worker died (exit code {self.process.exitcode})"

    def setup(self, spec: Any) -> None:
        """Start a process for `spec` (the runner's problem description)."""
        self.spec = spec
        self._kill()
        self._start()
        status, answer = self._ask("setup", spec, self.setup_timeout_s)
        if status != "ok":
            self._kill()
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

    def _run(self, job: RunJob | CompareJob, what: str) -> tuple[str, Any]:
        if self.process is None:
            self.setup(self.spec)
        status, answer = self._ask("run", job, self.run_timeout_s)
        if status in ("dead", "poisoned"):
            log.warning("benchmark worker lost on %s (%s); restarting it", what, answer)
            self._kill()
            self.restarts += 1
            self.setup(self.spec)
        return status, answer

    def close(self) -> None:
        if self.conn is not None and self.process is not None and self.process.is_alive():
            try:
                self.conn.send(("stop", None))
                self.process.join(timeout=10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()
