"""The Triton copy of `kernels.transpose` on the GPU: the same values in the K-major layout, for
8-bit and 16-bit types, ragged and batched."""

import pytest
import torch

from gemmtune.kernels.transpose import _triton_copy, k_major_copy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def operand(shape, dtype):
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, device="cuda", dtype=dtype)
    return torch.randn(shape, device="cuda").to(dtype)


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16]
)
@pytest.mark.parametrize("shape", [(4096, 1024), (333, 1001), (1, 4096), (4, 129, 300)])
@pytest.mark.parametrize("name", ["a", "b"])
def test_the_copy_holds_the_same_values_k_major(dtype, shape, name):
    assert _triton_copy() is not None  # the GPU machine has Triton: the tiled copy is tested
    t = operand(shape, dtype)
    if name == "a":  # a column-major a of this shape
        t = operand((*shape[:-2], shape[-1], shape[-2]), dtype).mT
    copy = k_major_copy(t, name)
    assert copy.stride(-1 if name == "a" else -2) == 1
    if dtype.itemsize == 1:  # fp8 has no equality of its own: compare the bytes
        assert torch.equal(copy.view(torch.uint8), t.view(torch.uint8))
    else:
        assert torch.equal(copy, t)
