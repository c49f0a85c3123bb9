"""Two ranks launched by torchrun pretune 16 buckets, each on its GPU with a cache of its own,
and end with identical records (needs two GPUs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]

CHILD = Path(__file__).with_name("pretune_gpu_child.py")


def test_two_ranks_split_sixteen_buckets_and_hold_identical_records(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         str(CHILD), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=560,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(reports[0]["records"]) == 16
    assert reports[0]["records"] == reports[1]["records"]  # byte-identical record JSON
    tuned = [set(r["tuned"]) for r in reports]
    assert tuned[0] and tuned[1] and not tuned[0] & tuned[1]
    assert len(tuned[0] | tuned[1]) == 16
