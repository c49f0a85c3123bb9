"""`gemmtune bench`'s contenders take their operands per call, so that both can take turns
over the same placements of them."""

import pytest
import torch

from gemmtune.cli.bench import contenders, torch_refusal


def test_torchs_contender_is_the_product_of_the_operands_it_is_given():
    _, torch_fn = contenders("tune", ())
    for _ in range(2):
        a, b = torch.randn(8, 32), torch.randn(32, 16)
        assert torch.equal(torch_fn(a, b), a @ b)


def test_a_call_torch_declines_leaves_the_row_without_torchs_time():
    declined = RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLt`")
    x = torch.randn(4, 4)

    def raising(error):
        def torch_fn(a, b):
            raise error

        return torch_fn

    assert "CUBLAS_STATUS_NOT_SUPPORTED" in torch_refusal(raising(declined), x, x)
    assert torch_refusal(lambda a, b: a @ b, x, x) is None
    with pytest.raises(RuntimeError, match="column-major"):  # a wrong call is no refusal
        torch_refusal(raising(RuntimeError("b must be column-major")), x, x)
