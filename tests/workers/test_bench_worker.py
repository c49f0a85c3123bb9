"""The benchmark worker survives crashes, hangs and CUDA faults of the candidates it runs, and
serves one problem after another in one process."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "measure"))
from fake_runner import CRASH, FAULT, HANG, WRONG, fake_ms

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.runner import ProblemSpec, RunJob
from gemmtune.measure.verify import check, relative_error, tolerance
from gemmtune.workers.bench import BenchWorker, WorkerFailure

RUNNER = "fake_runner:FakeRunner"
SPEC = ProblemSpec(256, 256, 256, 1, KernelSignature())


def run(worker, tile_m, tile_n):
    config = GemmConfig(
        tile_m=tile_m, tile_n=tile_n, schedule="pingpong" if tile_m == 64 else "cooperative"
    )
    return config, worker.measure(RunJob(config.to_json(), "unused.o"), config.key)


@pytest.mark.timeout(120)
def test_worker_restarts_after_crash_hang_and_fault_and_goes_on():
    with BenchWorker().lease(run_timeout_s=5) as worker:
        worker.setup(RUNNER, SPEC)
        config, good = run(worker, 128, 128)
        assert good.ms == pytest.approx(fake_ms(config)) and good.error is None
        for tile, why in ((CRASH, "died"), (HANG, "hung"), (FAULT, "illegal memory access")):
            _, failed = run(worker, *tile)
            assert failed.ms is None and why in failed.error
            # the next candidate runs in a fresh process
            config, after = run(worker, 128, 256)
            assert after.ms == pytest.approx(fake_ms(config))
        assert worker.restarts == 3
        _, wrong = run(worker, *WRONG)
        assert wrong.ms is None and "wrong result" in wrong.error
        assert worker.restarts == 3  # a wrong answer is not a reason to restart


def test_worker_setup_failure_is_reported_and_the_process_serves_the_next_problem():
    worker = BenchWorker(setup_timeout_s=60)
    with worker.lease(), pytest.raises(WorkerFailure):
        worker.setup("fake_runner:NoSuchRunner", SPEC)
    pid = worker.helper.process.pid
    with worker.lease() as leased:
        leased.setup(RUNNER, SPEC)
        config, good = run(leased, 128, 128)
        assert good.ms == pytest.approx(fake_ms(config))
    assert worker.helper.process.pid == pid and worker.restarts == 0
    worker.stop()
    assert not worker.helper.alive


def test_tolerance_depends_on_the_output_dtype():
    ref = torch.randn(64, 64)
    assert tolerance(torch.float32) < tolerance(torch.float16) < tolerance(torch.bfloat16)
    ok, err = check(ref.to(torch.bfloat16), ref)
    assert ok and 0 < err < tolerance(torch.bfloat16)
    # a transposed tile is far outside
    assert not check(ref.t().contiguous().to(torch.bfloat16), ref)[0]
    poisoned = ref.clone()
    poisoned[3, 5] = math.nan
    assert relative_error(poisoned, ref) == math.inf
    assert not check(poisoned, ref)[0]


UNGUARDED_SCRIPT = """
import sys
sys.path.insert(0, {bench!r})
from gemmtune.measure.runner import RunJob
from gemmtune.core.config import GemmConfig
from gemmtune.workers.bench import BenchWorker

# no `if __name__ == "__main__":` guard, as in many users' scripts
with BenchWorker().lease() as worker:
    worker.setup("fake_runner:ReliableRunner", None)
    print("measured", worker.measure(RunJob(GemmConfig().to_json(), "unused.o"), "k").ms)
"""


@pytest.mark.timeout(120)
def test_a_script_without_a_main_guard_is_not_run_again_by_the_worker(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(UNGUARDED_SCRIPT.format(bench=str(Path(__file__).parents[1] / "measure")))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("measured") == 1
