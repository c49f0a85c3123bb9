"""The scales of an fp8 product, applied to the accumulators before the epilogue.

`torch._scaled_mm` computes `(a @ b) * scale_a * scale_b` with the scales per tensor (one
element each) or per row of `a` and per column of `b`. Both are linear in the accumulators,
so a kernel scales each item's accumulators as soon as its k-range is summed: a split-K or
stream-K partial is scaled before it is published, and the reduction adds scaled partials.
Imports the DSL: kernel-side only.
"""

import cutlass
import cutlass.cute as cute


@cute.jit
def scale_accumulators(
    accumulators: cute.Tensor,
    coords: cute.Tensor | None,
    row_scale: cute.Tensor,
    col_scale: cute.Tensor,
    extent_mn: tuple,
    per_row: cutlass.Constexpr,
):
    """Multiply one thread's fp32 accumulators by their row's and column's scales.

    `row_scale` and `col_scale` are 1-D fp32 tensors in global memory indexed by the kernel's
    rows (M) and columns (N); with `per_row` False each holds one element. `coords` is the
    thread's (m, n) coordinates of its accumulators (per-row scaling only).

    A WGMMA accumulator fragment is ((2, 2, V), MMA_M, MMA_N): of the first mode's sub-modes
    the first steps a column, the second eight rows, the third eight columns. So a thread's
    rows are indexed by (mode 0.1, mode 1) and its columns by (mode 0.0, mode 0.2, mode 2):
    their scales are read once each (rows kept in registers, a column's read as it is used),
    not once per element, which would keep a load per accumulator in flight and spill.
    Scales of rows and columns past the edges read as 0: those elements are never stored.
    """
    if cutlass.const_expr(per_row):
        values, mma_m, mma_n = accumulators.shape
        pairs, rows_per_atom, column_groups = values
        row_factors = cute.make_rmem_tensor((rows_per_atom, mma_m), cutlass.Float32)
        for mi in cutlass.range_constexpr(mma_m):
            for r in cutlass.range_constexpr(rows_per_atom):
                row = coords[((0, r, 0), mi, 0)][0]
                factor = cutlass.Float32(0.0)
                if row < extent_mn[0]:
                    factor = row_scale[row]
                row_factors[r, mi] = factor
        for ni in cutlass.range_constexpr(mma_n):
            for v in cutlass.range_constexpr(column_groups):
                for c in cutlass.range_constexpr(pairs):
                    column = coords[((c, 0, v), 0, ni)][1]
                    factor = cutlass.Float32(0.0)
                    if column < extent_mn[1]:
                        factor = col_scale[column]
                    for mi in cutlass.range_constexpr(mma_m):
                        for r in cutlass.range_constexpr(rows_per_atom):
                            i = ((c, r, v), mi, ni)
                            accumulators[i] = accumulators[i] * (row_factors[r, mi] * factor)
    else:
        factor = row_scale[0] * col_scale[0]
        accumulators.store(accumulators.load() * factor)
