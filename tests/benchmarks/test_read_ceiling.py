"""The read-ceiling suite's choices on a CPU: which weights it reads and what each read moves."""

import torch
from benchmarks.read_ceiling import bytes_moved, contenders, decode_weights


def test_it_reads_each_decode_projection_of_the_serving_suite_once_at_its_real_size():
    weights = decode_weights()
    assert weights["l8b_o"] == (4096, 4096)
    assert weights["l8b_down"] == (14336, 4096)
    assert weights["l70b_gateup"] == (8192, 57344)
    # one entry per projection (8B and 70B: qkv, o, gate-up, down), not one per batch size
    assert len(weights) == 8 and all("_m" not in name for name in weights)


def test_a_copy_counts_its_read_and_written_bytes_and_the_empty_kernel_none():
    assert bytes_moved("sum", 100) == 100 and bytes_moved("stream", 100) == 100
    assert bytes_moved("copy", 100) == 200
    assert bytes_moved("empty", 100) == 0


def test_the_contenders_read_the_weight_they_are_given():
    weight = torch.arange(16, dtype=torch.bfloat16)
    partials, target = torch.empty(1), torch.empty_like(weight)
    sink, total = torch.zeros(1), torch.zeros(())
    fns = contenders(weight, partials, target, sink, total)
    fns["sum"]()
    fns["copy"]()
    fns["empty"]()
    assert total.item() == 120.0 and torch.equal(target, weight) and sink.item() == 1.0
