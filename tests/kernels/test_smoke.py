"""The toolchain lane: the smoke kernel compiles for both targets without a GPU, runs on one."""

import pytest
import torch

from gemmtune.cli import doctor


@pytest.mark.compile
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_smoke_kernel_compiles_without_gpu(target):
    result = doctor.compile_check(target)
    assert result["ok"], result.get("error")


@pytest.mark.gpu
def test_smoke_kernel_runs_on_gpu():
    from gemmtune.kernels import smoke

    compiled = smoke.compile_axpy()
    for n in (1, 1000, 4099):
        x = torch.randn(n, device="cuda")
        y = torch.randn(n, device="cuda")
        expected = 2.5 * x + y
        compiled(x, y, 2.5)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, expected)
