"""`benchmarks.timings` on the GPU: a config is verified before it is timed, back to back or in
a window after torch's product. torch stands in for the kernels, so no DSL is needed."""

import pytest
import torch
from benchmarks.timings import SIGNATURES, ShapeRun

from gemmtune.core.config import GemmConfig
from gemmtune.measure.timing import L2Flusher

pytestmark = pytest.mark.gpu
CONFIG = GemmConfig()


def stand_in(signature: str, right: bool):
    """A 'kernel' with the compiled one's arguments: torch's product (or zeros)."""

    def kernel(a, b, out, *rest):
        if not right:
            out.zero_()
            return
        product = a.float() @ b.float()
        if signature == "e4m3":
            scale_a, scale_b = rest[:2]
            product = product * scale_a * scale_b
        out.copy_(product)

    return kernel


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("window_ms", [0.0, 2.0])
def test_a_right_config_is_timed_and_a_wrong_one_is_not(dtype, window_ms):
    signature = SIGNATURES[dtype]
    timed = []
    for right in (True, False):
        kernels = {(CONFIG.compile_key, signature.ab_dtype): stand_in(dtype, right)}
        run = ShapeRun(
            256, 384, 512, signature, kernels, L2Flusher(), 5, warmup_ms=1, window_ms=window_ms
        )
        timed.append(run.measure(CONFIG))
    (ms, err), (wrong_ms, wrong_err) = timed
    assert ms is not None and ms > 0 and err < 1e-2
    assert wrong_ms is None and wrong_err > 0.5
    torch.cuda.synchronize()
