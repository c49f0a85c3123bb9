"""Operands timed at several places in memory (`measure.runner`): how many, and in turn."""

import torch

from gemmtune.measure.runner import (
    MAX_PLACEMENTS,
    PLACEMENT_BYTES,
    placed_copies,
    placements_for,
    taking_turns,
)

MB = 1 << 20


def test_placements_fill_the_byte_budget_up_to_the_cap():
    assert placements_for(84 * MB) == MAX_PLACEMENTS
    assert placements_for(PLACEMENT_BYTES // 3) == 3
    assert placements_for(PLACEMENT_BYTES // 2) == 2
    assert placements_for(PLACEMENT_BYTES) == 1
    assert placements_for(3 * PLACEMENT_BYTES) == 1


def test_placements_leave_most_of_the_free_memory_alone():
    # each extra copy may take a quarter of what is free: 84 MB copies in 400 MB free, one
    assert placements_for(84 * MB, free_bytes=400 * MB) == 2
    assert placements_for(84 * MB, free_bytes=100 * MB) == 1
    assert placements_for(84 * MB, free_bytes=80 << 30) == MAX_PLACEMENTS


def test_copies_hold_the_same_values_and_strides_elsewhere():
    a = torch.randn(16, 64)
    b = torch.randn(48, 64).t()  # a K-major weight, as x @ w.t() gives it
    placed = placed_copies(a, b, 3)
    assert len(placed) == 3
    assert placed[0][0] is a and placed[0][1] is b
    for pa, pb in placed[1:]:
        assert torch.equal(pa, a) and torch.equal(pb, b)
        assert pa.stride() == a.stride() and pb.stride() == b.stride()
    pointers = {t.data_ptr() for pair in placed for t in pair}
    assert len(pointers) == 6


def test_one_placement_is_the_operands_themselves():
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    assert placed_copies(a, b, 1) == [(a, b)]


def test_runs_take_the_placements_in_turn():
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    placed = placed_copies(a, b, 3)
    seen = []
    run = taking_turns(lambda x, y: seen.append((x.data_ptr(), y.data_ptr())), placed)
    for _ in range(7):
        run()
    expected = [(x.data_ptr(), y.data_ptr()) for x, y in placed]
    assert seen == (expected * 3)[:7]
