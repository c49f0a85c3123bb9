"""`gemmtune bench` on a GPU: a row checked, then both contenders timed taking turns over the
same placements of the operands."""

import pytest
import torch

from gemmtune.cli.bench import compare_with_cublas
from gemmtune.measure.runner import fitting_copies
from gemmtune.measure.timing import L2Flusher

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


def test_the_bench_placements_are_equal_copies_at_other_addresses():
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16).t()
    placed = fitting_copies(a, b)
    assert len(placed) == 4 and placed[0][0] is a and placed[0][1] is b
    assert len({w.data_ptr() for _, w in placed}) == 4
    assert all(torch.equal(w, b) and w.stride() == b.stride() for _, w in placed)
    assert all(torch.equal(x, a) for x, _ in placed)


def test_a_decode_row_is_verified_and_timed_on_four_placements():
    flush = L2Flusher(torch.cuda.current_device())
    shape = {"name": "decode", "m": 16, "n": 4096, "k": 4096}
    row = compare_with_cublas(shape, "bf16", "heuristic", 50, flush, "nk")
    assert row["correct"] and row["placements"] == 4
    assert row["config"] != "cublas"
    assert 0.2 < row["ratio"] < 5
