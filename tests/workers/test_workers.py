"""Helper processes live as long as the process: reused by every tune, replaced after a crash
or a hang, never compiling what the kernel cache holds, stopped when idle."""

import sys
from pathlib import Path

import pytest

from gemmtune import workers
from gemmtune.core.config import GemmConfig
from gemmtune.kernels.signature import KernelSignature
from gemmtune.workers.compiler import CompileJob, CompilePool, compile_all

sys.path.insert(0, str(Path(__file__).parent))
from fake_compile_service import CRASH, FAIL, HANG

FAKE = "fake_compile_service:FakeCompileService"
pytestmark = pytest.mark.timeout(180)


def job(tile_n: int) -> CompileJob:
    return CompileJob(GemmConfig(tile_m=128, tile_n=tile_n), KernelSignature())


def test_compile_workers_survive_crashes_hangs_and_failures_and_are_reused(tmp_path):
    pool = CompilePool("sm_90a", max_workers=2, timeout_s=3.0, service=FAKE)
    try:
        outcomes = compile_all([job(t) for t in (CRASH, HANG, FAIL, 192, 256)], tmp_path, pool)
        by_tile = {o.job.config.tile_n: o for o in outcomes}
        assert "died" in by_tile[CRASH].error and "hung" in by_tile[HANG].error
        assert "ptxas" in by_tile[FAIL].error
        assert all(by_tile[t].path is not None and not by_tile[t].cached for t in (192, 256))
        assert pool.workers == 2  # the lost workers were replaced, not added to
        live = _pids(pool)
        (fresh,) = compile_all([job(160)], tmp_path, pool)
        assert fresh.path.read_text() in live  # served by a process already running
        # what the folder holds is not compiled again
        again = compile_all([job(192), job(256)], tmp_path, pool)
        assert all(o.cached and o.compile_s == 0 for o in again)
    finally:
        pool.stop_workers()


def _pids(pool: CompilePool) -> set[str]:
    return {str(w.helper.process.pid) for w in pool._workers if w.helper.process}


def test_idle_workers_stop_and_come_back(tmp_path):
    pool = CompilePool("sm_90a", max_workers=1, service=FAKE)
    compile_all([job(192)], tmp_path, pool, reuse=False)
    assert not pool.stop_workers(idle_s=3600)  # used a moment ago
    assert pool.stop_workers(idle_s=0) and pool.workers == 0
    (outcome,) = compile_all([job(192)], tmp_path, pool, reuse=False)
    assert outcome.path is not None and pool.workers == 1
    pool.stop_workers()


def test_the_process_shares_one_pool_per_target_and_one_worker_per_gpu():
    assert workers.compile_pool("sm_90a") is workers.compile_pool("sm_90a")
    assert workers.compile_pool("sm_90a") is not workers.compile_pool("sm_100a")
    assert workers.bench_worker(0) is workers.bench_worker(0)
    assert workers.bench_worker(0) is not workers.bench_worker(0, import_main=True)


def test_a_compile_worker_never_imports_torch():
    """A compile worker never pays torch's import, which tvm_ffi attempts."""
    import subprocess

    code = (
        "import multiprocessing, sys; multiprocessing.current_process().name = 'gemmtune-x';"
        "from gemmtune.workers.process import load;"
        "load('gemmtune.workers.compiler:CompileService');"
        "import gemmtune.kernels.build, gemmtune.workers;"
        "print(sorted(m for m in ('torch', 'gemmtune.api.dispatch', 'gemmtune.tuning.tuner')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
