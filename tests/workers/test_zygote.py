"""Helpers forked by the zygote behave as spawned ones do: they take the parent's environment,
directory and path at the moment they are asked for, survive nothing the spawned ones would not,
and the zygote steps aside where it cannot serve (another DSL target, gone)."""

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from gemmtune.workers import zygote
from gemmtune.workers.bench import BenchWorker
from gemmtune.workers.compiler import CompilePool, compile_all
from gemmtune.workers.process import HelperProcess

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "measure"))
from fake_compile_service import CRASH, FAIL, HANG
from fake_runner import CRASH as RUN_CRASH
from fake_runner import fake_ms
from test_workers import job

pytestmark = pytest.mark.timeout(180)
PROBE = "probe_service:ProbeService"


@pytest.fixture
def forked(monkeypatch):
    """A zygote forked from this process (no DSL import), made the process's own. It takes
    itself for one that imported the DSL for sm_90a, the target the tests compile for (this
    process may have imported the DSL already)."""
    monkeypatch.setattr(zygote, "_preloaded", "sm_90a")
    parent = zygote.Zygote.start(preload=None)
    monkeypatch.setattr(zygote, "_zygotes", {False: parent, True: parent})
    yield parent
    parent.stop()
    _reap(parent.pid)


def _reap(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            return True
        if done:
            return True
        time.sleep(0.02)
    return False


def _ask(helper: HelperProcess, payload="HOME"):
    status, answer = helper.ask("probe", payload, 60)
    assert status == "ok", answer
    return answer


def test_a_forked_helper_takes_the_parents_state_at_the_request(forked, monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMTUNE_PROBE", "set after the zygote was forked")
    monkeypatch.chdir(tmp_path)
    helper = HelperProcess(PROBE, None, role="probe")
    helper.start()
    try:
        seen = _ask(helper, "GEMMTUNE_PROBE")
        assert seen["env"] == "set after the zygote was forked"
        assert seen["cwd"] == str(tmp_path)
        assert seen["name"].startswith("gemmtune-probe-")
        assert seen["ppid"] == forked.pid  # forked by the zygote, not spawned by us
        assert helper.process.pid == seen["pid"] and helper.alive
    finally:
        helper.stop()
    assert not helper.alive


def test_compile_workers_forked_by_the_zygote_survive_crashes_hangs_and_failures(forked, tmp_path):
    pool = CompilePool(
        "sm_90a", max_workers=2, timeout_s=3.0, service="fake_compile_service:FakeCompileService"
    )
    try:
        outcomes = compile_all([job(t) for t in (CRASH, HANG, FAIL, 192, 256)], tmp_path, pool)
        by_tile = {o.job.config.tile_n: o for o in outcomes}
        assert "died" in by_tile[CRASH].error and "hung" in by_tile[HANG].error
        assert "ptxas" in by_tile[FAIL].error
        assert all(by_tile[t].path is not None for t in (192, 256))
        assert pool.workers == 2
        for worker in pool._workers:
            assert isinstance(worker.helper.process, zygote.ForkedProcess)
    finally:
        pool.stop_workers()


def test_the_benchmark_worker_forked_by_the_zygote_restarts_after_a_crash(forked):
    from gemmtune.core.config import GemmConfig
    from gemmtune.kernels.signature import KernelSignature
    from gemmtune.measure.runner import ProblemSpec, RunJob

    def run(worker, tile_m, tile_n):
        config = GemmConfig(
            tile_m=tile_m, tile_n=tile_n, schedule="pingpong" if tile_m == 64 else "cooperative"
        )
        return config, worker.measure(RunJob(config.to_json(), "unused.o"), config.key)

    with BenchWorker().lease(run_timeout_s=5) as worker:
        worker.setup("fake_runner:FakeRunner", ProblemSpec(256, 256, 256, 1, KernelSignature()))
        assert isinstance(worker.helper.process, zygote.ForkedProcess)
        _, crashed = run(worker, *RUN_CRASH)
        assert crashed.ms is None and "died" in crashed.error
        config, after = run(worker, 128, 256)
        assert after.ms == pytest.approx(fake_ms(config)) and worker.restarts == 1
    worker.stop()


def test_the_zygote_refuses_compile_helpers_for_another_dsl_target(monkeypatch):
    import cutlass  # noqa: F401  the zygote then holds a DSL that read its target at import

    monkeypatch.setattr(zygote, "_preloaded", "sm_90a")  # what a fork of this process inherits
    parent = zygote.Zygote.start(preload=None)
    try:
        _, refused = parent.fork(PROBE, None, "gemmtune-probe-x", dsl_target="sm_100a")
        with pytest.raises(OSError, match="compiles for sm_90a"):
            refused.wait_forked(30)
        conn, process = parent.fork(PROBE, None, "gemmtune-probe-y", dsl_target="sm_90a")
        assert process.wait_forked(30) > 0 and process.is_alive()
        conn.close()  # the helper's pipe closes: it exits
        process.join(30)
        assert not process.is_alive()
    finally:
        parent.stop()
        _reap(parent.pid)


def test_helpers_are_spawned_once_the_zygote_is_gone(forked, monkeypatch):
    forked.stop()
    assert _reap(forked.pid) and zygote.current() is None and zygote.current(True) is None
    helper = HelperProcess(PROBE, None, role="probe")
    helper.start()
    try:
        assert _ask(helper)["ppid"] == os.getpid()  # spawned by this process
    finally:
        helper.stop()


def test_a_process_forked_from_the_owner_neither_uses_nor_closes_its_zygote(forked):
    pid = os.fork()
    if pid == 0:  # a data loader worker, say: it must spawn its own helpers
        code = 0 if zygote.current() is None and zygote.current(True) is None else 1
        forked.stop()  # what atexit would do there: must not shut the shared socket down
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    helper = HelperProcess(PROBE, None, role="probe")
    helper.start()
    try:
        assert _ask(helper)["ppid"] == forked.pid  # the zygote still serves its owner
    finally:
        helper.stop()


def test_helpers_for_the_main_script_are_never_forked(forked):
    helper = HelperProcess(PROBE, None, role="probe", import_main=True)
    helper.start()
    try:
        assert _ask(helper)["ppid"] == os.getpid()
    finally:
        helper.stop()


def test_fork_is_safe_only_before_cuda_with_one_thread(monkeypatch):
    import torch

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os.path, "exists", lambda path: path == "/dev/nvidiactl")
    monkeypatch.setattr(zygote, "cuda_driver_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.delenv(zygote.PRESTART_ENV, raising=False)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert zygote.fork_is_safe()
    monkeypatch.setenv(zygote.PRESTART_ENV, "0")
    assert not zygote.fork_is_safe()
    monkeypatch.delenv(zygote.PRESTART_ENV)
    monkeypatch.setattr(zygote, "cuda_driver_initialized", lambda: True)  # cuInit has run
    assert not zygote.fork_is_safe()
    monkeypatch.setattr(zygote, "cuda_driver_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not zygote.fork_is_safe()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # another Python thread runs
    assert not zygote.fork_is_safe()


def test_modules_whose_import_was_under_way_are_dropped(monkeypatch):
    import types
    from importlib.machinery import ModuleSpec

    half = types.ModuleType("users_half_imported_module")
    half.__spec__ = ModuleSpec(half.__name__, None)
    half.__spec__._initializing = True
    monkeypatch.setitem(sys.modules, half.__name__, half)
    zygote._forget_unfinished_imports()
    assert half.__name__ not in sys.modules and "gemmtune.workers.zygote" in sys.modules


@pytest.mark.compile
def test_compile_workers_forked_after_the_dsl_import_compile_real_kernels(monkeypatch, tmp_path):
    """The zygote imports the DSL once; its forks start with it and compile for its target."""
    from gemmtune.core.config import GemmConfig
    from gemmtune.kernels.signature import KernelSignature
    from gemmtune.workers.compiler import CompileJob

    parent = zygote.Zygote.start(preload="sm_90a")
    monkeypatch.setattr(zygote, "_zygotes", {True: parent})
    probe = HelperProcess(PROBE, None, role="probe", dsl_target="sm_90a")
    pool = CompilePool("sm_90a", max_workers=2)
    try:
        probe.start()
        assert _ask(probe)["cutlass_imported"]  # forked after the zygote imported the DSL
        configs = [GemmConfig(tile_m=128, tile_n=n) for n in (128, 192)]
        outcomes = compile_all([CompileJob(c, KernelSignature()) for c in configs], tmp_path, pool)
        assert all(o.error is None and o.path.stat().st_size > 0 for o in outcomes)
        assert all(isinstance(w.helper.process, zygote.ForkedProcess) for w in pool._workers)
    finally:
        probe.stop()
        pool.stop_workers()
        parent.stop()
        _reap(parent.pid, timeout=120)


def test_a_helper_the_zygote_refuses_is_spawned(monkeypatch):
    import cutlass  # noqa: F401

    monkeypatch.setattr(zygote, "_preloaded", "sm_90a")
    parent = zygote.Zygote.start(preload=None)
    monkeypatch.setattr(zygote, "_zygotes", {True: parent})
    helper = HelperProcess(PROBE, None, role="probe", dsl_target="sm_100a")
    helper.start()
    try:
        assert _ask(helper)["ppid"] == os.getpid()
    finally:
        helper.stop()
        parent.stop()
        _reap(parent.pid)
