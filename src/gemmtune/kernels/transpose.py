"""K-major copies of operands, for the layouts 8-bit WGMMA cannot read and the strides TMA cannot.

8-bit WGMMA reads A and B K-major from shared memory. An int8 or fp8 product whose `a` is
column-major or whose `b` is row-major (`x @ w` of a row-major weight) is multiplied by our
kernels on a K-major copy of that operand, made on every call (`GemmProblem.copied` names
them). cuBLASLt multiplies int8 in those layouts at a fifth to an eighth of its K-major speed
(`docs/kernels.md`), so the copy plus our kernel beats it even where the copy moves a decode
batch's whole weight; the tuner times the copy with each candidate, and torch's own function
on the operands as given, so a bucket where that is not so still goes to torch.
A 16-bit operand in that layout whose strides TMA cannot take (a row-major weight of 2,100
columns: rows of 4,200 bytes) is copied the same way: the copy's rows are padded to 16 bytes.
cuBLAS multiplies such operands with slow kernels of its own (2050 x 2100 x 2000 bf16 `x @ w`:
126 µs on an H200, against 30 µs with aligned rows).

The copy is a tiled transpose in Triton: each program loads a tile of the source and stores it
to the destination, Triton staging it through shared memory so that both sides are coalesced
(about 4 TB/s on an H200 for 8-bit matrices of 16-117 MB, where `Tensor.copy_` of the same
transposed view runs at a tenth of that). Without Triton, or for CPU tensors, `Tensor.copy_`
makes the same copy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from gemmtune.core.dtypes import ALIGNMENT_BYTES
from gemmtune.kernels.schedule_model import ceil_div

#: Tile of the copy, rows x columns of the source, and its warps: the fastest of the tiles
#: timed for 8-bit matrices (128x128 with 8 warps 3-10 % ahead of 64x64 with 4).
TILE_ROWS = 128
TILE_COLS = 128
TILE_WARPS = 8


def k_major_copy(t: torch.Tensor, operand: str) -> torch.Tensor:
    """A copy of `t`, operand `a` ((..., m, k)) or `b` ((..., k, n)) of `a @ b`, whose K
    dimension is contiguous and whose other strides are multiples of 16 bytes (each row of K
    padded), as TMA loads it: the same values, shape and dtype."""
    if operand not in ("a", "b"):
        raise ValueError(f"operand {operand!r}: use 'a' or 'b'")
    *lead, rows, cols = t.shape
    if operand == "a":  # (..., m, k): rows of k
        buffer = t.new_empty((*lead, rows, padded(cols, t.element_size())))[..., :cols]
    else:  # (..., k, n): columns of k, stored as the rows of its transpose
        buffer = t.new_empty((*lead, cols, padded(rows, t.element_size())))[..., :rows].mT
    copy_into(buffer, t)
    return buffer


def k_major_operands(
    a: torch.Tensor, b: torch.Tensor, copied: tuple[str, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`a` and `b` with the operands named in `copied` replaced by K-major copies."""
    return (
        k_major_copy(a, "a") if "a" in copied else a,
        k_major_copy(b, "b") if "b" in copied else b,
    )


def copying_launcher(launcher: Callable, copied: tuple[str, ...]) -> Callable:
    """`launcher(a, b, out, *args)` run on K-major copies of the operands named in `copied`."""

    def launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *args) -> None:
        launcher(*k_major_operands(a, b, copied), out, *args)

    return launch


def padded(count: int, itemsize: int) -> int:
    """`count` elements rounded up to a whole number of 16-byte units."""
    unit = max(1, ALIGNMENT_BYTES // itemsize)
    return ceil_div(count, unit) * unit


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)` for two tensors of one shape and dtype, by the tiled transpose where
    the GPU and Triton allow."""
    kernel = _triton_copy() if src.is_cuda and src.numel() else None
    if kernel is None or src.dim() not in (2, 3):
        dst.copy_(src)
        return
    s, d = (x if x.dim() == 3 else x.unsqueeze(0) for x in (src, dst))
    batch, rows, cols = s.shape
    grid = (ceil_div(rows, TILE_ROWS), ceil_div(cols, TILE_COLS), batch)
    kernel[grid](
        s, d, rows, cols, *s.stride(), *d.stride(),
        TILE_ROWS=TILE_ROWS, TILE_COLS=TILE_COLS, num_warps=TILE_WARPS,
    )  # fmt: skip


@functools.cache
def _triton_copy():
    """The Triton kernel of the tiled copy, or None where Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def tiled_copy(
        src, dst, rows, cols,
        src_batch, src_row, src_col, dst_batch, dst_row, dst_col,
        TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr,
    ):  # fmt: skip
        batch = tl.program_id(2).to(tl.int64)
        r = tl.program_id(0).to(tl.int64) * TILE_ROWS + tl.arange(0, TILE_ROWS)[:, None]
        c = tl.program_id(1).to(tl.int64) * TILE_COLS + tl.arange(0, TILE_COLS)[None, :]
        inside = (r < rows) & (c < cols)
        values = tl.load(src + batch * src_batch + r * src_row + c * src_col, mask=inside)
        tl.store(dst + batch * dst_batch + r * dst_row + c * dst_col, values, mask=inside)

    return tiled_copy
