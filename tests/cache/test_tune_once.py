"""One tune per bucket across processes: the others wait for it and take its winner; a holder
that dies leaves no lock behind (real processes, a fake tuner, no GPU)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("tune_once_child.py")

pytestmark = pytest.mark.timeout(300)


def start(folder: Path, tune_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(folder), str(tune_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def config_of(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err[-2000:]
    return next(line.split()[1] for line in out.splitlines() if line.startswith("CONFIG"))


def tunes(folder: Path) -> list[str]:
    log = folder / "tunes.log"
    return log.read_text().split() if log.exists() else []


def test_four_processes_on_one_bucket_tune_it_once_and_agree(tmp_path):
    processes = [start(tmp_path, 3.0) for _ in range(4)]
    configs = [config_of(p) for p in processes]
    assert len(tunes(tmp_path)) == 1
    assert len(set(configs)) == 1


def test_a_holder_that_dies_leaves_no_lock_behind(tmp_path):
    holder = start(tmp_path, 600.0)
    deadline = time.monotonic() + 120
    while not tunes(tmp_path):  # the holder is tuning: it has the lock
        assert time.monotonic() < deadline and holder.poll() is None
        time.sleep(0.1)
    waiter = start(tmp_path, 0.5)
    time.sleep(2.0)
    assert waiter.poll() is None  # waiting on the holder's lock
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate()
    config_of(waiter)  # the waiter took the lock and tuned
    assert len(tunes(tmp_path)) == 2
