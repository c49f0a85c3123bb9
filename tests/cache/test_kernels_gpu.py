"""A second process loads a kernel from the disk cache, without compiling, and it runs."""

import json
import os
import subprocess
import sys

import pytest
import torch

from gemmtune.kernels.build import artifact_suffix
from gemmtune.measure.verify import tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

SCRIPT = """
import json, sys, torch
from gemmtune.cache.kernels import KernelCache
from gemmtune.core.config import GemmConfig
from gemmtune.kernels.launch import launch
from gemmtune.kernels.signature import KernelSignature

cache = KernelCache("sm_90a", sys.argv[1])
config = GemmConfig(tile_m=128, tile_n=128, cluster_m=2)
kernel = cache.get(config, KernelSignature())
a = torch.randn(1000, 264, device="cuda", dtype=torch.bfloat16)
b = torch.randn(264, 392, device="cuda", dtype=torch.bfloat16)
out = torch.full((1000, 392), float("nan"), device="cuda", dtype=torch.bfloat16)
launch(kernel, a, b, out, config)
ref = a.float() @ b.float()
err = ((out.float() - ref).norm() / ref.norm()).item()
print(json.dumps({"loads": cache.loads, "compiles": cache.compiles, "err": err,
                  "dsl_imported": "cutlass" in sys.modules}))
"""


def run(folder):
    env = dict(os.environ, GEMMTUNE_CACHE_DIR=str(folder))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder)],
        capture_output=True, text=True, timeout=500, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_without_compiling(tmp_path):
    first = run(tmp_path)
    assert (first["compiles"], first["loads"]) == (1, 0) and first["err"] < tolerance(
        torch.bfloat16
    )
    second = run(tmp_path)
    assert (second["compiles"], second["loads"]) == (0, 1) and second["err"] < tolerance(
        torch.bfloat16
    )
    # kernels and device facts both came from the cache: the DSL was never imported
    assert second["dsl_imported"] is (artifact_suffix() != ".so")
