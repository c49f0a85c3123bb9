"""The top-level package: its public names load on first use, and importing it registers the
custom op without loading the tuner or the API layer."""

import subprocess
import sys

import gemmtune


def test_every_public_name_resolves():
    assert sorted(gemmtune.__all__) == sorted(["__version__", *gemmtune._EXPORTS])
    for name in gemmtune.__all__:
        assert getattr(gemmtune, name) is not None


def test_import_registers_the_op_and_loads_nothing_else():
    code = (
        "import sys, torch, gemmtune; print(hasattr(torch.ops.gemmtune, 'mm'),"
        "sorted(m for m in ('gemmtune.api.dispatch', 'gemmtune.tuning.tuner', 'cutlass')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "[]"]
