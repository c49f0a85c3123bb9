"""The bytes a GEMM must move, and the bandwidth reference a memory-bound row is judged by."""

import pytest
import torch

from gemmtune.measure.bandwidth import MemoryBandwidth, gemm_bytes, measure_bandwidth


def test_a_gemm_moves_its_operands_once_and_writes_its_output_once():
    # a decode batch of 16 against an 8B down projection: the weight is nearly all of it
    assert gemm_bytes(16, 4096, 14336, 2, 2) == (16 * 14336 + 14336 * 4096 + 16 * 4096) * 2
    assert gemm_bytes(4, 8, 16, 2, 4, l=3) == 3 * ((4 * 16 + 16 * 8) * 2 + 4 * 8 * 4)


def test_the_reference_is_the_faster_of_read_and_copy():
    assert MemoryBandwidth(read_gbps=4100.0, copy_gbps=3900.0).reference_gbps == 4100.0
    assert MemoryBandwidth(read_gbps=3000.0, copy_gbps=3900.0).reference_gbps == 3900.0


@pytest.mark.gpu
def test_measured_bandwidth_is_that_of_an_hbm_gpu():
    found = measure_bandwidth(runs=10)
    props = torch.cuda.get_device_properties(0)
    assert 500 < found.read_gbps < 10_000 and 500 < found.copy_gbps < 10_000, (found, props.name)
