"""The plan-cache key: the C signature (`_signature.c`) tells calls apart exactly where the
Python one does, and gives way to it for what it cannot read."""

import itertools
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from gemmtune.api.dispatch import NATIVE_SIGNATURE, plan_key, python_signature

needs_native = pytest.mark.skipif(
    NATIVE_SIGNATURE is None, reason="the _signature extension is not built"
)


def test_the_extension_is_built_where_a_compiler_and_pythons_headers_are():
    """The build is optional, so a C error would only show as a slower tuned_gemm: here it fails."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.exists():
        pytest.skip("no C compiler or no Python headers on this machine")
    assert NATIVE_SIGNATURE is not None


def operands() -> list[torch.Tensor]:
    """Tensors that differ in one fact each: shape, strides, dtype, rank, a size-1 or empty
    dimension, a transposed or sliced view, a broadcast stride, an autograd leaf."""
    base = torch.randn(6, 8)
    wide = torch.randn(6, 16)
    return [
        base,
        torch.randn(6, 8),  # the same facts in another tensor: the same key
        wide[:, :8],  # same shape, wider rows
        wide[:, 1:9],  # same again, one element further: a pointer, not a key, fact
        torch.randn(8, 6).t(),
        base.to(torch.bfloat16),
        base.to(torch.float16),
        base.to(torch.int8),
        torch.randn(6, 1),
        torch.empty_strided((6, 1), (1, 6)),
        torch.randn(0, 8),
        torch.randn(6, 8).expand(2, 6, 8),
        torch.randn(2, 6, 8),
        torch.nn.Parameter(torch.randn(6, 8)),
    ]


@needs_native
def test_the_c_signature_tells_calls_apart_exactly_as_python_does():
    tensors = operands()
    pairs = list(itertools.product(tensors, repeat=2))
    native = [NATIVE_SIGNATURE(a, b) for a, b in pairs]
    python = [python_signature(a, b) for a, b in pairs]
    assert all(isinstance(key, bytes) for key in native)
    for i, j in itertools.combinations(range(len(pairs)), 2):
        assert (native[i] == native[j]) == (python[i] == python[j]), (pairs[i], pairs[j])
    a, b = tensors[0], tensors[4]
    assert NATIVE_SIGNATURE(a, b, a) != NATIVE_SIGNATURE(a, b, a.t().contiguous().t())
    assert NATIVE_SIGNATURE(tensors[0], tensors[3]) == NATIVE_SIGNATURE(tensors[1], tensors[2])


@needs_native
def test_what_the_c_signature_cannot_read_is_read_from_python():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    deep = torch.randn((1,) * 9)
    for tensors in ((a, "b"), (a, None), (a, b, a, b, a), (deep, b)):
        assert NATIVE_SIGNATURE(*tensors) is None
    assert plan_key(deep, b, None, None, None) == python_signature(deep, b)
    with pytest.raises(AttributeError):  # a wrong call fails as it fails without the key
        plan_key(a, "b", None, None, None)


@pytest.mark.parametrize("signature", [NATIVE_SIGNATURE, None], ids=["native", "python"])
def test_call_arguments_join_the_key_only_where_given(signature):
    if signature is None and NATIVE_SIGNATURE is None:
        pytest.skip("covered by the python case")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    bare = plan_key(a, b, None, None, None, signature)
    assert plan_key(a, b, None, torch.float32, None, signature) == (
        bare, torch.float32, None, False
    )  # fmt: skip
    assert plan_key(a, b, None, None, "tune", signature) == (bare, None, "tune", False)
    assert plan_key(a, b, None, None, None, signature, constant_b=True) == (bare, None, None, True)
    assert plan_key(a, b, torch.empty(4, 4), None, None, signature) != bare
