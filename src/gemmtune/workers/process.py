"""A helper process: answering one request at a time, never re-running the user's script.

A helper is forked by the zygote where there is one (`zygote.py`: it holds torch and the DSL
already, so the helper starts in milliseconds), else spawned: forking the user's process itself
is not safe once it holds a CUDA context. A spawned process imports the parent's main script so that
functions defined there can be found; a script without an `if __name__ == "__main__":` guard
that calls `tuned_gemm` at its top level would run again in every helper. Our services need
nothing from the main script, so it is hidden from `multiprocessing` while a helper starts
(`main_script_hidden`). (`@autotune` on a function of a guarded main script is the exception:
its worker must import the script.)

The child builds its service once (its imports happen then, while the parent goes on), says
"ready", and answers requests until told to stop. The parent waits for each answer with a time
limit; a child that dies or outlives the limit is reported "dead" and killed, and the owner of
the helper decides whether to start another.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Literal

from gemmtune import HELPER_PROCESS_PREFIX

log = logging.getLogger(__name__)

Status = Literal["ok", "error", "poisoned", "dead"]
#: The exit code of a child whose service said an error left it unusable (a CUDA fault).
EXIT_POISONED = 3

_names = itertools.count(1)


class HelperFailure(RuntimeError):
    """A helper could not start its service (an import failed, the GPU is unusable...)."""


def load(path: str) -> Any:
    """The object named "module:name"."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _serve(conn, service_path: str, init: Any) -> None:
    """The child: build the service, then answer (kind, payload) requests until "stop"."""
    try:
        service = load(service_path)(init)
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        try:
            conn.send(("ok", service.handle(kind, payload)))
        except Exception as exc:  # the request's failure, reported to the parent
            poisoned = service.poisoned(exc)
            conn.send(("poisoned" if poisoned else "error", f"{type(exc).__name__}: {exc}"))
            if poisoned:
                os._exit(EXIT_POISONED)


class HelperProcess:
    """A spawned child running the service `service_path` ("module:Class", built from `init`).

    `start` returns at once; the child imports what its service needs while the parent goes
    on, and the first request waits for it (up to `start_timeout_s`)."""

    def __init__(
        self,
        service_path: str,
        init: Any = None,
        *,
        role: str = "helper",
        import_main: bool = False,
        dsl_target: str | None = None,
        start_timeout_s: float = 120.0,
    ):
        self.service_path = service_path
        self.init = init
        self.role = role
        self.import_main = import_main
        self.dsl_target = dsl_target  # the DSL target the service compiles for, if any
        self.name = ""
        self.start_timeout_s = start_timeout_s
        self.process: Any = None
        self.conn: Any = None
        self._ready = False

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        self.name = f"{HELPER_PROCESS_PREFIX}{self.role}-{next(_names)}"
        self._ready = False
        if not self.import_main and self._fork():
            return
        self._spawn()

    def _spawn(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, self.service_path, self.init), name=self.name, daemon=True
        )
        with contextlib.nullcontext() if self.import_main else main_script_hidden():
            self.process.start()
        child.close()

    def _fork(self) -> bool:
        """Ask the process's zygote to fork the helper; False where there is none."""
        from gemmtune.workers import zygote

        parent = zygote.current(compiles=self.dsl_target is not None)
        if parent is None:
            return False
        try:
            self.conn, self.process = parent.fork(
                self.service_path, self.init, self.name, dsl_target=self.dsl_target
            )
        except OSError as exc:
            log.debug("%s is spawned: %s", self.name, exc)
            return False
        return True

    def _spawn_if_not_forked(self) -> None:
        """Where the zygote was asked for this helper but refused it, or is gone, spawn it."""
        from gemmtune.workers.zygote import ForkedProcess

        if isinstance(self.process, ForkedProcess):
            try:
                self.process.wait_forked(self.start_timeout_s)
            except OSError as exc:
                log.debug("%s is spawned: %s", self.name, exc)
                self.conn.close()
                self._spawn()

    def wait_ready(self) -> None:
        """Block until the service is built; HelperFailure if it cannot be."""
        if self._ready:
            return
        if self.process is None:
            self.start()
        self._spawn_if_not_forked()
        try:
            if not self.conn.poll(self.start_timeout_s):
                raise HelperFailure(f"no answer within {self.start_timeout_s:.0f} s of starting")
            status, detail = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=10)
            code = self.process.exitcode
            raise HelperFailure(f"exited while starting (exit code {code})") from None
        if status != "ready":
            raise HelperFailure(detail)
        self._ready = True

    def ask(self, kind: str, payload: Any, timeout: float) -> tuple[Status, Any]:
        """Send a request and wait for its answer: ("ok", answer), ("error" | "poisoned",
        why), or ("dead", why) when the child died or did not answer within `timeout`
        seconds (it is then killed)."""
        try:
            self.wait_ready()
        except HelperFailure as exc:
            self.kill()
            return "dead", f"worker failed to start: {exc}"
        try:
            self.conn.send((kind, payload))
            if not self.conn.poll(timeout):
                self.kill()
                return "dead", f"no answer within {timeout:.0f} s (hung)"
            return self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.process.join(timeout=10)
            code = self.process.exitcode
            self.kill()
            return "dead", f"worker died (exit code {code})"

    def kill(self) -> None:
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None
        self._ready = False

    def stop(self) -> None:
        """Ask the child to exit, then make sure it has."""
        if self.alive and self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.send(("stop", None))
                self.process.join(timeout=5)
        self.kill()


_lock = threading.Lock()
_depth = 0
_saved: dict[str, object] = {}


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """Processes spawned inside this block do not import the main script. Re-entrant and
    thread-safe: the script is restored when the last block ends."""
    global _depth
    main = sys.modules.get("__main__")
    with _lock:
        if _depth == 0 and main is not None:
            _saved.clear()
            _saved.update(
                {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
            )
            main.__dict__.pop("__file__", None)
            main.__spec__ = None
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and main is not None:
                main.__dict__.update(_saved)
                if "__spec__" not in _saved:
                    main.__dict__.pop("__spec__", None)
