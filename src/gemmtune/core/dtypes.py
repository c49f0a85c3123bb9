"""The element types gemmtune names and the alignment its kernels need, importing nothing heavy.

Kernels, signatures, cache keys and the command line name types by short names ("bf16");
tensors carry torch dtypes. This module maps between the two without importing torch at
import time, so that a compile worker, which never touches a tensor, does not pay torch's
import.
"""

from __future__ import annotations

from typing import Any

#: short name -> (torch attribute, bytes per element)
_TABLE = {
    "bf16": ("bfloat16", 2),
    "fp16": ("float16", 2),
    "fp32": ("float32", 4),
    "int8": ("int8", 1),
    "int32": ("int32", 4),
    "e4m3": ("float8_e4m3fn", 1),
    "e5m2": ("float8_e5m2", 1),
}
_BY_TORCH_NAME = {f"torch.{attr}": name for name, (attr, _) in _TABLE.items()}

#: TMA's rule for every tensor a kernel reads or writes: a 16-byte aligned base address, and
#: every stride but the contiguous one a multiple of 16 bytes.
ALIGNMENT_BYTES = 16

#: Input types our kernels multiply, and the output types they write for each: 16-bit floats
#: accumulate in fp32 and are written in any float type; int8 accumulates in int32 and is
#: written exactly, as `torch._int_mm` does; fp8 accumulates in fp32, is scaled and written in
#: a 16- or 32-bit float, as `torch._scaled_mm` does.
OUTPUTS_OF = {
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("bf16", "fp16", "fp32"),
    "int8": ("int32",),
    "e4m3": ("bf16", "fp16", "fp32"),
    "e5m2": ("bf16", "fp16", "fp32"),
}
KERNEL_INPUTS = tuple(OUTPUTS_OF)
KERNEL_OUTPUTS = ("bf16", "fp16", "fp32", "int32")
#: The fp8 types: A and B may differ (e4m3 with e5m2), and their products are scaled.
FP8 = ("e4m3", "e5m2")
#: Input types of one byte: the 8-bit MMAs read both operands K-major from shared memory.
EIGHT_BIT = ("int8", *FP8)
#: How an fp8 product is scaled, as `torch._scaled_mm` takes its scales: "tensor", one scale
#: for each operand; "row", one per row of A (m of them) and one per column of B (n).
SCALINGS = ("tensor", "row")


def inputs_pair(a: str, b: str) -> bool:
    """Whether kernels multiply an A of type `a` by a B of type `b`: equal types, or two fp8."""
    return a in KERNEL_INPUTS and (a == b or (a in FP8 and b in FP8))


def name_of(dtype: Any) -> str | None:
    """The short name of a torch dtype ("bf16" for torch.bfloat16), or None for one gemmtune
    does not name."""
    return _BY_TORCH_NAME.get(str(dtype))


def torch_dtype(name: str) -> Any:
    """The torch dtype of a short name; ValueError for a name gemmtune does not know."""
    import torch

    if name not in _TABLE:
        raise ValueError(f"unknown dtype {name!r}: use one of {', '.join(_TABLE)}")
    return getattr(torch, _TABLE[name][0])


def itemsize(name: str) -> int:
    """Bytes per element of the type named `name`."""
    return _TABLE[name][1]


def label(dtype: Any) -> str:
    """A short name where there is one, else torch's name: for messages."""
    return name_of(dtype) or str(dtype).removeprefix("torch.")
