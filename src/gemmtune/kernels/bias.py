"""A bias added to the product before it is rounded to the output type.

The bias has one element per column of the output (`torch.addmm`, a linear layer,
`torch._scaled_mm(..., bias=)`), in the output's type. A swapped binary computes out^T, so
there it is one element per row of the kernel's tile.

It is added once per output tile, to the finished sums: where a tile is computed whole
(data-parallel) or gathered by its owner (stream-K), to the accumulators before the epilogue
(`add_bias`, `add_row_bias`); where split-K segments each write a share of the tile, to each
share's sums (`reduction.reduce_share`). Partial sums never carry it, and an fp8 product's
scales, which apply to the partials, never multiply it.

Along the tile's columns a slice of the bias goes through shared memory, as fp32: each thread
of the tile's group loads its elements into registers as the tile's mainloop starts
(`load_tile_bias`), so the loads are over by the time the sums are; after the mainloop it writes
them to the group's buffer (`stage_tile_bias`), where every thread reads the elements of its
own columns (or, for a split-K share, of the values the reduction gives it). Read from global
memory after the mainloop, they would be loads in flight beside the accumulators, one per
column a thread holds, on the path from the last MMA to the epilogue. Along the tile's rows (a
swapped binary summing whole tiles) a thread's accumulators span 2-4 rows: it loads their
terms into registers before the mainloop (`load_row_bias`), and no buffer is used
(`rules.row_bias_in_registers`).
Imports the DSL: kernel-side only.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline


def bias_slots(length: int, threads: int) -> int:
    """Elements of a tile's bias slice (`length` of them) each of `threads` threads loads."""
    return -(-length // threads)


@cute.jit
def load_tile_bias(
    bias: cute.Tensor,
    origin: cutlass.Int32,
    extent: cutlass.Int32,
    length: cutlass.Constexpr,
    thread: cutlass.Int32,
    threads: cutlass.Constexpr,
) -> cute.Tensor:
    """This thread's elements of the bias slice [origin, origin + length) (element
    `thread + s * threads` in slot s), as fp32 registers; 0 past `extent`, whose sums are never
    stored. Nothing waits for the loads until `stage_tile_bias`."""
    slots = bias_slots(length, threads)
    pending = cute.make_rmem_tensor((slots,), cutlass.Float32)
    for s in cutlass.range_constexpr(slots):
        pending[s] = cutlass.Float32(0.0)
        i = thread + s * threads
        if i < length and origin + i < extent:
            pending[s] = bias[origin + i].to(cutlass.Float32)
    return pending


@cute.jit
def stage_tile_bias(
    buffer: cute.Tensor,
    pending: cute.Tensor,
    length: cutlass.Constexpr,
    thread: cutlass.Int32,
    threads: cutlass.Constexpr,
    group_barrier: pipeline.NamedBarrier,
):
    """Write this thread's loaded elements to the group's shared `buffer` (fp32, `length`),
    then wait for the group's: each thread reads elements others loaded. Every thread of the
    group must have finished reading the buffer's previous tile (the epilogue's and the
    reduction's barriers see to that)."""
    for s in cutlass.range_constexpr(bias_slots(length, threads)):
        i = thread + s * threads
        if i < length:
            buffer[i] = pending[s]
    group_barrier.arrive_and_wait()


@cute.jit
def add_bias(accumulators: cute.Tensor, tile_coords: cute.Tensor, buffer: cute.Tensor):
    """Add the tile's bias along its columns (in the shared `buffer`, `stage_tile_bias`) to one
    thread's fp32 accumulators; `tile_coords` are the thread's (m, n) coordinates of them
    within the tile.

    A WGMMA accumulator fragment is ((2, 2, V), MMA_M, MMA_N): of the first mode's sub-modes
    the first steps a column, the second eight rows, the third eight columns. So a thread's
    columns are indexed by (mode 0.0, mode 0.2, mode 2), and each element of the bias is read
    once."""
    values, mma_m, mma_n = accumulators.shape
    pairs, rows_per_atom, column_groups = values
    for ni in cutlass.range_constexpr(mma_n):
        for v in cutlass.range_constexpr(column_groups):
            for c in cutlass.range_constexpr(pairs):
                term = buffer[tile_coords[((c, 0, v), 0, ni)][1]]
                for mi in cutlass.range_constexpr(mma_m):
                    for r in cutlass.range_constexpr(rows_per_atom):
                        i = ((c, r, v), mi, ni)
                        accumulators[i] = accumulators[i] + term


@cute.jit
def load_row_bias(
    bias: cute.Tensor,
    tile_coords: cute.Tensor,
    origin: cutlass.Int32,
    extent: cutlass.Int32,
    fragment_shape: cutlass.Constexpr,
) -> cute.Tensor:
    """The bias of this thread's own accumulator rows (a swapped binary's bias runs along M:
    the rows of `fragment_shape`, `add_bias`'s (mode 0.1, mode 1)), as fp32 registers indexed
    (row of the atom, MMA_M); 0 past `extent`, whose sums are never stored. Loaded before the
    mainloop; nothing waits for them until `add_row_bias`."""
    values, mma_m, _ = fragment_shape
    _, rows_per_atom, _ = values
    terms = cute.make_rmem_tensor((rows_per_atom, mma_m), cutlass.Float32)
    for mi in cutlass.range_constexpr(mma_m):
        for r in cutlass.range_constexpr(rows_per_atom):
            row = origin + tile_coords[((0, r, 0), mi, 0)][0]
            terms[r, mi] = cutlass.Float32(0.0)
            if row < extent:
                terms[r, mi] = bias[row].to(cutlass.Float32)
    return terms


@cute.jit
def add_row_bias(accumulators: cute.Tensor, terms: cute.Tensor):
    """Add `load_row_bias`'s terms to one thread's fp32 accumulators, each to its row."""
    values, mma_m, mma_n = accumulators.shape
    pairs, rows_per_atom, column_groups = values
    for mi in cutlass.range_constexpr(mma_m):
        for r in cutlass.range_constexpr(rows_per_atom):
            for ni in cutlass.range_constexpr(mma_n):
                for v in cutlass.range_constexpr(column_groups):
                    for c in cutlass.range_constexpr(pairs):
                        i = ((c, r, v), mi, ni)
                        accumulators[i] = accumulators[i] + terms[r, mi]
