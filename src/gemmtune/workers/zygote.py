"""The zygote: a process forked from the user's at `import gemmtune`, whose forks are our helpers.

A helper spawned fresh must import torch (about 4 s on the GPU hosts we measure) or the CuTe DSL
(about 3 s) before it can work, and a first tune waits for both. At `import gemmtune` the
process has imported torch and, in the usual program, made no CUDA context yet: a fork then
holds torch for nothing. The zygote is that fork. It imports the DSL for the GPU's target while
the program goes on, and forks helpers on request (`Zygote.fork`): a compile worker that starts
with the DSL imported, a benchmark worker that has only its CUDA context to make.

A fork is safe only before CUDA is initialised in the process (the child of a process whose
driver is initialised cannot use the GPU) and while only one Python thread runs (a lock another
thread holds stays locked in the child forever). `start_if_safe` checks both, and more; where
anything fails, helpers are spawned as before (`process.HelperProcess`). Helpers that must
import the user's main script (`@autotune` on a function defined there) are always spawned:
the zygote was forked while that script was running.

What a fork inherits that a spawned process would not have is put right: each request carries
the parent's environment, working directory and sys.path; modules whose import was under way
at the fork are dropped, to be imported afresh where needed; output the parent had buffered is
never written again; signal handlers are reset. The zygote exits when the parent's end of its
pipe closes (the parent exited or died), and helpers exit when their own pipe closes.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import io
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import warnings
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

#: "0" never forks a zygote (every helper is spawned).
PRESTART_ENV = "GEMMTUNE_PRESTART"
ZYGOTE_NAME = "gemmtune-zygote"
#: `Zygote.start(preload=...)`: import the DSL for the target of this machine's GPUs.
PRELOAD_GPU_TARGET = "gpu"
#: cuCtxGetCurrent's answer before cuInit: the driver is untouched and a fork may use the GPU.
CUDA_ERROR_NOT_INITIALIZED = 3

#: The process's zygotes: True, the one that imports the DSL (compile workers are forked from
#: it); False, the one that does not (benchmark workers, which must not wait for that import).
_zygotes: dict[bool, Zygote] = {}
#: In the zygote and its forks: the DSL target the zygote imported the DSL for.
_preloaded: str | None = None
#: The parent's objects the zygote holds on to: freeing one could flush output that is the
#: parent's to write, or close a descriptor whose number has since been reused.
_kept: list[Any] = []


class ForkedProcess:
    """The parent's handle on a helper the zygote forks: the part of `multiprocessing.Process`
    that helpers use. The zygote answers a request with the new pid once it gets to it (it may
    still be importing the DSL), so the pid is a future; the process is not the parent's child
    (the zygote reaps it), so it is watched by pid."""

    exitcode = None  # the zygote reaps the process; its exit code is not known here

    def __init__(self, forked: Future):
        self._forked = forked

    def wait_forked(self, timeout: float) -> int:
        """The helper's pid, once forked; OSError when the zygote refused or is gone."""
        try:
            return self._forked.result(timeout)
        except FutureTimeout:  # not the builtin TimeoutError before Python 3.11
            raise OSError(f"the zygote did not fork within {timeout:.0f} s") from None

    @property
    def pid(self) -> int | None:
        return (
            self._forked.result() if self._forked.done() and not self._forked.exception() else None
        )

    def is_alive(self) -> bool:
        if not self._forked.done():
            return True  # asked for, not forked yet
        pid = self.pid
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (a new owner of the pid: gone)
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.wait_forked(60.0), signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)


class Zygote:
    """The parent's side: the zygote's pid and pipe, and a thread that reads its answers (in
    the order of the requests), started by the first request. Thread-safe."""

    def __init__(self, pid: int, conn: Connection):
        self.pid = pid
        self.conn: Connection | None = conn
        # a process forked from the owner later (a data loader worker) shares the socket, and
        # must neither talk on it nor shut it down
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._waiting: collections.deque[Future] = collections.deque()
        self._reader: threading.Thread | None = None

    @classmethod
    def start(cls, preload: str | None = PRELOAD_GPU_TARGET) -> Zygote:
        """Fork the zygote now (the caller has checked that this is safe). It imports the DSL
        for the target `preload` names ("sm_90a"; `PRELOAD_GPU_TARGET`: the GPU's, read from
        NVML, which leaves CUDA untouched; None: no DSL)."""
        ours, theirs = multiprocessing.Pipe()  # a socket pair: descriptors can travel on it
        with warnings.catch_warnings():
            # Python warns of a fork in a process with other threads, counting threads that
            # torch's import started in C++; they hold no lock while idle, and
            # `start_if_safe` made sure no other Python thread runs.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            ours.close()  # else the zygote would never see the parent's end close
            _zygote_main(theirs, preload)  # never returns
        theirs.close()
        return cls(pid, ours)

    @property
    def alive(self) -> bool:
        return self.conn is not None and os.getpid() == self.owner

    def fork(
        self, service_path: str, init: Any, name: str, *, dsl_target: str | None = None
    ) -> tuple[Connection, ForkedProcess]:
        """Ask for a helper that serves `service_path` built from `init` (as `process._serve`
        does), under the process name `name`: its pipe and handle, at once. A helper that
        compiles for `dsl_target` is refused where the zygote imported the DSL for another
        target (the DSL reads its target once, at import): the handle's `wait_forked` says so.
        OSError when the zygote is gone."""
        ours, theirs = multiprocessing.Pipe()
        state = (dict(os.environ), os.getcwd(), list(sys.path), dsl_target)
        forked: Future = Future()
        try:
            with self._lock:
                if not self.alive:
                    raise OSError("the zygote has exited, or is another process's")
                try:
                    self.conn.send((service_path, init, name, state))
                    reduction.send_handle(self.conn, theirs.fileno(), self.pid)
                except OSError as exc:
                    self._gone(f"the zygote has exited ({exc})")
                    raise OSError(f"the zygote has exited ({exc})") from None
                self._waiting.append(forked)
                if self._reader is None:
                    self._reader = threading.Thread(
                        target=self._read_answers, name="gemmtune-zygote", daemon=True
                    )
                    self._reader.start()
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        return ours, ForkedProcess(forked)

    def _read_answers(self) -> None:
        conn = self.conn
        while conn is not None:
            try:
                status, detail = conn.recv()
            except (EOFError, OSError):
                self._gone("the zygote has exited")
                return
            with self._lock:
                forked = self._waiting.popleft()
            if status == "forked":
                forked.set_result(detail)
            else:
                forked.set_exception(OSError(f"the zygote did not fork: {detail}"))

    def _gone(self, why: str) -> None:
        with self._lock:
            if self.conn is not None and os.getpid() == self.owner:
                # shut the socket down before closing it: that wakes the thread reading it,
                # whose read would otherwise keep it open, and tells the zygote we are gone
                with (
                    contextlib.suppress(OSError),
                    socket.socket(fileno=os.dup(self.conn.fileno())) as sock,
                ):
                    sock.shutdown(socket.SHUT_RDWR)
                self.conn.close()
                self.conn = None
            waiting, self._waiting = list(self._waiting), collections.deque()
        for forked in waiting:
            forked.set_exception(OSError(why))

    def stop(self) -> None:
        """Close the pipe: the zygote exits (helpers it forked go on until their pipes close)."""
        self._gone("the zygote was stopped")


def current(compiles: bool = False) -> Zygote | None:
    """The process's zygote for helpers that compile (the DSL imported) or do not, if one was
    forked and has not exited."""
    found = _zygotes.get(compiles)
    return found if found is not None and found.alive else None


def start_if_safe() -> None:
    """Fork the process's two zygotes where that is safe and useful; nothing otherwise."""
    from gemmtune.core.settings import MODE_ENV

    if os.environ.get(MODE_ENV, "tune") != "tune":  # no tuning: no helper will be needed
        return
    if _zygotes or not fork_is_safe():
        return
    import atexit

    try:
        # two, so that a benchmark worker is forked at once while the other imports the DSL
        # (the zygote's own thread, which reads answers, starts on its first request: these
        # forks happen while this process runs one thread)
        for compiles in (False, True):
            started = Zygote.start(PRELOAD_GPU_TARGET if compiles else None)
            _zygotes[compiles] = started
            atexit.register(started.stop)
    except OSError as exc:
        log.debug("no zygote (%s): helpers will be spawned", exc)


def fork_is_safe() -> bool:
    """Whether this process may fork a zygote now: Linux, a GPU, the main process of a
    program (not a helper, not a multiprocessing child), one Python thread, torch imported
    without CUDA and the CUDA driver not initialised, and GEMMTUNE_PRESTART not "0"."""
    if os.environ.get(PRESTART_ENV, "1").strip() == "0":
        return False
    if not sys.platform.startswith("linux") or not os.path.exists("/dev/nvidiactl"):
        return False
    if multiprocessing.parent_process() is not None or threading.active_count() != 1:
        return False
    from gemmtune import _in_helper_process

    torch = sys.modules.get("torch")
    if _in_helper_process() or torch is None or torch.cuda.is_initialized():
        return False
    return not cuda_driver_initialized()


def cuda_driver_initialized() -> bool:
    """Whether cuInit has run in this process (torch.cuda.is_available() runs it, without
    torch counting CUDA as initialised). True where the driver cannot be asked: then no fork."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    context = ctypes.c_void_p()
    return driver.cuCtxGetCurrent(ctypes.byref(context)) != CUDA_ERROR_NOT_INITIALIZED


def gpu_compile_target() -> str | None:
    """The DSL target of this machine's GPUs ("sm_90a"), read from NVML, which does not
    initialise CUDA; None without NVML, without GPUs, with GPUs of several targets or of one
    our kernels do not serve."""
    from gemmtune.core.device import Arch
    from gemmtune.kernels.build import KERNEL_MODULES

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        arches = set()
        for index in range(count.value):
            handle, major, minor = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                return None
            capability = ctypes.byref(major), ctypes.byref(minor)
            nvml.nvmlDeviceGetCudaComputeCapability(handle, *capability)
            arches.add(Arch.from_capability(major.value, minor.value))
    finally:
        nvml.nvmlShutdown()
    if len(arches) != 1:
        return None
    (arch,) = arches
    return arch.compile_target if arch.value in KERNEL_MODULES else None


# -- the zygote's side -----------------------------------------------------------------------


def _zygote_main(conn: Connection, preload: str | None) -> None:
    """Become the zygote: put right what the fork inherited, import the DSL, then fork a
    helper per request until the parent's end closes."""
    try:
        _become(ZYGOTE_NAME)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the parent's; it closes our pipe
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # helpers are reaped as they exit
        _forget_unfinished_imports()
        if preload is not None:
            _import_compiler(gpu_compile_target() if preload == PRELOAD_GPU_TARGET else preload)
        while True:
            try:
                service_path, init, name, state = conn.recv()
                fd = reduction.recv_handle(conn)
            except (EOFError, OSError):
                return
            wanted = state[-1]
            if wanted is not None and "cutlass" in sys.modules and _preloaded != wanted:
                os.close(fd)
                conn.send(("refused", f"the zygote's DSL compiles for {_preloaded}"))
                continue
            pid = os.fork()
            if pid == 0:
                conn.close()
                _helper_main(fd, service_path, init, name, state)  # never returns
            os.close(fd)
            conn.send(("forked", pid))
    except BaseException:  # nothing may unwind into the parent's stack, which is not ours
        log.debug("the zygote stops", exc_info=True)
    finally:
        os._exit(0)


def _helper_main(fd: int, service_path: str, init: Any, name: str, state: tuple) -> None:
    """A forked helper: the parent's environment, directory and path, then `_serve`."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own children (a linker) are waited for
        signal.signal(signal.SIGINT, signal.default_int_handler)
        environment, cwd, path, _ = state
        os.environ.clear()
        os.environ.update(environment)
        os.chdir(cwd)
        sys.path[:] = path
        multiprocessing.current_process().name = name
        from gemmtune.workers.process import _serve

        _serve(Connection(fd), service_path, init)
    except BaseException:  # a helper never returns into the stack it was forked on
        code = 1
    finally:
        os._exit(code)


def _become(name: str) -> None:
    """Take the name of a helper, and leave the parent's buffered output and objects alone."""
    multiprocessing.current_process().name = name
    for stream in ("stdout", "stderr"):
        old = getattr(sys, stream)
        _kept.append(old)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            fresh = io.TextIOWrapper(
                io.FileIO(old.fileno(), "w", closefd=False), line_buffering=True
            )
            setattr(sys, stream, fresh)
    gc.freeze()  # the parent's objects are never collected here, nor their pages copied


def _forget_unfinished_imports() -> None:
    """Drop the modules whose import was under way at the fork (the ones that led to `import
    gemmtune`): they stop where the fork came, and a helper that needs one imports it whole.
    gemmtune itself had finished all but its last statement."""
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if spec is None or not getattr(spec, "_initializing", False):
            continue
        if name == "gemmtune" or name.startswith("gemmtune."):
            continue
        _kept.append(sys.modules.pop(name))


def _import_compiler(target: str | None) -> None:
    global _preloaded
    if target is None:
        return
    if "cutlass" in sys.modules and os.environ.get("CUTE_DSL_ARCH") != target:
        return  # the program imported the DSL before gemmtune, for a target of its own
    os.environ["CUTE_DSL_ARCH"] = target
    _preloaded = target  # set before the import: a failed one may have read the target
    try:
        from gemmtune.kernels.build import import_compiler

        import_compiler(target)
    except Exception:  # compile workers forked from here import it themselves, and report
        log.debug("the zygote could not import the DSL for %s", target, exc_info=True)
