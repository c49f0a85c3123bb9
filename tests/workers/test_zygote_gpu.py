"""In a new process on a GPU, `import gemmtune` forks the zygotes, and a tune and an
`@autotune` run on helpers forked from them: correct results, the right parents."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
REPO = Path(__file__).parents[2]

SCRIPT = r"""
import json, os, torch
import gemmtune
from gemmtune import workers
from gemmtune.workers import zygote
from benchmarks.autotune_subject import chunked_matmul

def parent_of(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("PPid:"):
            return int(line.split()[1])

plain, compiling = zygote.current(False), zygote.current(True)
a = torch.randn(1000, 1528, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1528, 704, device="cuda", dtype=torch.bfloat16)  # rows of 16 bytes

c = gemmtune.tuned_gemm(a, b)
error = ((c.float() - a.float() @ b.float()).abs().max() / (a.float() @ b.float()).abs().max())
x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
y = chunked_matmul(x, w)
bench = workers.bench_worker(0).helper.process
pool = workers.compile_pool("sm_90a")
print(json.dumps({
    "zygotes": [plain.pid, compiling.pid] if plain and compiling else None,
    "bench_parent": parent_of(bench.pid),
    "compile_parents": sorted({parent_of(w.helper.process.pid) for w in pool._workers}),
    "compile_processes": [type(w.helper.process).__name__ for w in pool._workers],
    "pools": {k: len(p._workers) for k, p in workers._compile_pools.items()},
    "compiled": sorted(os.listdir(os.environ["GEMMTUNE_CACHE_DIR"])),
    "script": os.getpid(),
    "error": float(error),
    "autotune_ok": bool(torch.allclose(y.float(), x.float() @ w.float(), rtol=2e-2, atol=2e-1)),
    "plan": str(gemmtune.plan(a, b).config),
}))
"""


def test_a_new_process_tunes_on_helpers_its_zygotes_forked(tmp_path):
    env = {
        **os.environ,
        "GEMMTUNE_CACHE_DIR": str(tmp_path),
        "GEMMTUNE_CUBLAS": "0",  # our kernel runs, so its result is what is checked
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    env.pop("GEMMTUNE_PRESTART", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["zygotes"] is not None, "import gemmtune forked no zygote"
    plain, compiling = seen["zygotes"]
    assert seen["bench_parent"] == plain, json.dumps(seen)
    assert seen["compile_parents"] == [compiling], json.dumps(seen)
    assert seen["error"] < 2e-2 and seen["autotune_ok"]
    assert seen["plan"] != "None"
