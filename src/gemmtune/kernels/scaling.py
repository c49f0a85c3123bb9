"""The scales of an fp8 product, applied to the accumulators before the epilogue.

`torch._scaled_mm` computes `(a @ b) * scale_a * scale_b` with the scales per tensor (one
element each) or per row of `a` and per column of `b`. Both are linear in the accumulators,
so a kernel scales each item's accumulators as soon as its k-range is summed: a split-K or
stream-K partial is scaled before it is published, and the reduction adds scaled partials.

Per-tensor scales are read once per CTA, before its first mainloop (`tensor_scale_factor`):
read after each mainloop, the two loads' trip to memory (L2 holds nothing of them in a cold
run) sat between the last MMA and the epilogue, on every decode kernel's critical path.

Per-row scales go through shared memory: as a tile's mainloop starts, its consumer threads
copy the tile's row and column scales there with `cp.async` (`stage_tile_scales`), so the
global reads are over by the time the accumulators are summed, and none is waited for between
the mainloop and the epilogue. Read from global memory at that point, a tile's column scales
were loads in flight beside the accumulators (44 per thread of a 176-column tile), and such
binaries spilled where their per-tensor twins did not.
Imports the DSL: kernel-side only.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync


def _element(tensor: cute.Tensor, index) -> cute.Tensor:
    """The one-element tensor at `index` of a 1-D tensor: what a 4-byte copy moves."""
    return cute.make_tensor(tensor.iterator + index, cute.make_layout(1))


@cute.jit
def stage_tile_scales(
    buffer: cute.Tensor,
    row_scale: cute.Tensor,
    col_scale: cute.Tensor,
    tile_mn: cutlass.Constexpr,
    tile_origin_mn: tuple,
    extent_mn: tuple,
    thread: cutlass.Int32,
    threads: cutlass.Constexpr,
):
    """Start copying one tile's scales into `buffer` (shared fp32, tile_m + tile_n: the row
    scales, then the column scales). Every thread of the group calls it, and every thread must
    have finished reading the buffer's previous tile; `wait_tile_scales` ends the copy. Rows
    and columns past the edges get 0: their elements are never stored.
    """
    tile_m, tile_n = tile_mn
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Float32, num_bits_per_copy=32)
    for step in cutlass.range_constexpr((tile_m + tile_n + threads - 1) // threads):
        i = thread + step * threads
        if i < tile_m:
            row = tile_origin_mn[0] + i
            if row < extent_mn[0]:
                cute.copy(atom, _element(row_scale, row), _element(buffer, i))
            else:
                buffer[i] = cutlass.Float32(0.0)
        if i >= tile_m and i < tile_m + tile_n:
            column = tile_origin_mn[1] + i - tile_m
            if column < extent_mn[1]:
                cute.copy(atom, _element(col_scale, column), _element(buffer, i))
            else:
                buffer[i] = cutlass.Float32(0.0)
    cute.arch.cp_async_commit_group()


@cute.jit
def wait_tile_scales(group_barrier: pipeline.NamedBarrier):
    """Wait for this thread's scale copies, then for the group's: each thread reads scales
    that others copied."""
    cute.arch.cp_async_wait_group(0)
    group_barrier.arrive_and_wait()


@cute.jit
def tensor_scale_factor(row_scale: cute.Tensor, col_scale: cute.Tensor) -> cutlass.Float32:
    """The product of per-tensor scales (one element each in global memory)."""
    return row_scale[0] * col_scale[0]


@cute.jit
def scale_accumulators(
    accumulators: cute.Tensor,
    tile_coords: cute.Tensor | None,
    tensor_factor: cutlass.Float32,
    buffer: cute.Tensor | None,
    tile_m: cutlass.Constexpr,
    per_row: cutlass.Constexpr,
):
    """Multiply one thread's fp32 accumulators by their row's and column's scales.

    Per tensor, every accumulator is multiplied by `tensor_factor` (`tensor_scale_factor`).
    Per row, the tile's scales are in the shared `buffer` (`stage_tile_scales`) and
    `tile_coords` are the thread's (m, n) coordinates of its accumulators within the tile.

    A WGMMA accumulator fragment is ((2, 2, V), MMA_M, MMA_N): of the first mode's sub-modes
    the first steps a column, the second eight rows, the third eight columns. So a thread's
    rows are indexed by (mode 0.1, mode 1) and its columns by (mode 0.0, mode 0.2, mode 2):
    each scale is read once (rows kept in registers, a column's read as it is used), not
    once per element.
    """
    if cutlass.const_expr(per_row):
        values, mma_m, mma_n = accumulators.shape
        pairs, rows_per_atom, column_groups = values
        row_factors = cute.make_rmem_tensor((rows_per_atom, mma_m), cutlass.Float32)
        for mi in cutlass.range_constexpr(mma_m):
            for r in cutlass.range_constexpr(rows_per_atom):
                row_factors[r, mi] = buffer[tile_coords[((0, r, 0), mi, 0)][0]]
        for ni in cutlass.range_constexpr(mma_n):
            for v in cutlass.range_constexpr(column_groups):
                for c in cutlass.range_constexpr(pairs):
                    factor = buffer[tile_m + tile_coords[((c, 0, v), 0, ni)][1]]
                    for mi in cutlass.range_constexpr(mma_m):
                        for r in cutlass.range_constexpr(rows_per_atom):
                            i = ((c, r, v), mi, ni)
                            accumulators[i] = accumulators[i] * (row_factors[r, mi] * factor)
    else:
        accumulators.store(accumulators.load() * tensor_factor)
