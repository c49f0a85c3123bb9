"""K-major copies of operands (`kernels.transpose`) on the CPU, where `Tensor.copy_` makes them;
the Triton copy is checked against the same expectations on the GPU (`test_transpose_gpu.py`)."""

import pytest
import torch

from gemmtune.kernels.transpose import copying_launcher, k_major_copy, k_major_operands, padded


def int8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


def assert_k_major_copy(copy, original, operand):
    assert copy.shape == original.shape and copy.dtype == original.dtype
    assert torch.equal(copy, original) and copy.data_ptr() != original.data_ptr()
    k_dim = -1 if operand == "a" else -2
    other = -2 if operand == "a" else -1
    assert copy.stride(k_dim) == 1
    # every other stride a whole number of 16-byte units, as TMA loads it
    strides = [s for d, s in enumerate(copy.stride()) if d != copy.dim() + k_dim]
    assert all(s * copy.element_size() % 16 == 0 for s in strides)
    assert copy.stride(other) == padded(original.shape[k_dim], copy.element_size())


@pytest.mark.parametrize("shape", [(64, 128), (33, 100), (1, 7), (3, 20, 50)])
def test_a_column_major_a_is_copied_row_major_with_padded_rows(shape):
    a = int8(*shape[:-2], shape[-1], shape[-2]).mT  # column-major
    assert_k_major_copy(k_major_copy(a, "a"), a, "a")


@pytest.mark.parametrize("shape", [(128, 64), (100, 33), (7, 1), (3, 50, 20)])
def test_a_row_major_b_is_copied_column_major_with_padded_columns(shape):
    b = int8(*shape)  # row-major (k, n): x @ w of a row-major weight
    assert_k_major_copy(k_major_copy(b, "b"), b, "b")


def test_padding_counts_16_byte_units_of_the_element():
    assert [padded(n, 1) for n in (1, 16, 17, 100)] == [16, 16, 32, 112]
    assert [padded(n, 2) for n in (1, 8, 9)] == [8, 8, 16]
    assert padded(3, 4) == 4


def test_only_the_named_operands_are_copied_and_the_launcher_gets_the_copies():
    a, b = int8(40, 64).mT.contiguous().mT, int8(64, 24)
    same_a, copied_b = k_major_operands(a, b, ("b",))
    assert same_a is a and copied_b.stride() == (1, 64)
    seen = []
    launch = copying_launcher(lambda x, y, out, *args: seen.append((x, y, out, args)), ("a", "b"))
    out = torch.empty(40, 24, dtype=torch.int32)
    launch(a, b, out, 1, 2)
    ((x, y, o, args),) = seen
    assert x.stride() == (64, 1) and y.stride() == (1, 64) and o is out and args == (1, 2)
    assert torch.equal(x, a) and torch.equal(y, b)


def test_an_unknown_operand_is_refused():
    with pytest.raises(ValueError, match="operand 'c'"):
        k_major_copy(int8(4, 4), "c")
