"""`gemmtune bench`'s contenders take their operands per call, so that both can take turns
over the same placements of them."""

import torch

from gemmtune.cli.bench import contenders


def test_torchs_contender_is_the_product_of_the_operands_it_is_given():
    _, torch_fn = contenders("tune", ())
    for _ in range(2):
        a, b = torch.randn(8, 32), torch.randn(32, 16)
        assert torch.equal(torch_fn(a, b), a @ b)
