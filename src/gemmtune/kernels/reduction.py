"""Summing the partial accumulators of a shared tile, deterministically.

Several items (split-K splits, stream-K segments) compute parts of one output tile
(`schedule_model.WorkItem`). Each item that publishes writes its partial sums to its own
workspace slot and counts itself in at the tile's arrival counter (an int32, 0 between
launches) with release semantics: `publish_partial`. Then either
- one owner (stream-K) waits until all others have arrived, adds their partials to its
  accumulators in segment (k) order, resets the counter and runs the epilogue:
  `gather_partials`; or
- every segment (split-K), once all have arrived, sums its share of the tile over all the
  partials in segment order and writes it to the output; the last to leave resets the
  counter: `reduce_share`. The reads are spread over the segments instead of falling on one
  (an owner of 16 splits of a 128x256 tile reads 1.9 MB; a share is 128 KB).
Counters end at 0, so the next launch needs no memset; the order of the additions is fixed, so
the result never depends on timing.

A kernel that holds its accumulators in tensor memory reads them a sub-tile at a time, so it
publishes, and adds, by parts: `store_partial` then `signal_arrival`; `await_partials` then
`add_partials`.

Partials are stored in the accumulators' type (`SharedTile.dtype`): fp32, or int32 for int8
inputs, whose sums stay exact; both are four bytes, so the workspace (float32 storage) holds
either. Partial tiles are stored in the accumulators' register order, interleaved by thread
(float4 v of thread t at ((v * threads) + t) * 4), so each store and load is 16 bytes per
thread and coalesced across the warp.
"""

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from gemmtune.kernels.scheduler import share_blocks

#: most floats of a partial one thread loads at a time (registers for the loads in flight)
MAX_CHUNK = 64


@dataclass(frozen=True)
class SharedTile:
    """An output tile that several items compute, as one of them sees it: where the partial
    sums and the arrival counter are, which segment this item is, and which threads hold its
    accumulators. Frozen, so that the DSL's control flow reads it rather than carries it."""

    workspace: cute.Tensor
    counters: cute.Tensor
    first_slot: Int32  # the slot of segment 0's partial sums
    slot_stride: int  # slots between consecutive segments' partial sums
    counter: Int32
    segment: Int32
    segments: Int32
    thread: Int32  # counts from 0 among the `threads` (synchronised by `barrier`)
    threads: int
    barrier: pipeline.NamedBarrier
    dtype: type = cutlass.Float32  # the accumulators' (fp32, or int32 for int8 inputs)

    def slot(self, segment: Int32) -> Int32:
        return self.first_slot + segment * self.slot_stride


def _partials(tile: SharedTile, values: int) -> cute.Tensor:
    """The workspace as ((4, values/4, threads), slot) of the accumulators' type: one tile of
    partial sums per slot."""
    threads = tile.threads
    size = values * threads
    layout = cute.make_layout(
        ((4, values // 4, threads), cute.size(tile.workspace) // size),
        stride=((1, 4 * threads, 4), size),
    )
    return cute.make_tensor(cute.recast_ptr(tile.workspace.iterator, dtype=tile.dtype), layout)


@cute.jit
def _await_arrivals(tile: SharedTile, arrivals: Int32):
    """Hold the group until `arrivals` items have counted in at the tile's counter (thread 0
    polls it with acquire semantics, the barrier releases the others)."""
    counter = tile.counters.iterator + tile.counter
    if tile.thread == 0:
        seen = cute.arch.load(counter, Int32, sem="acquire", scope="gpu")
        while seen < arrivals:
            seen = cute.arch.load(counter, Int32, sem="acquire", scope="gpu")
    tile.barrier.arrive_and_wait()


def _partial_load_atom(dtype: type) -> cute.CopyAtom:
    """16-byte loads of partial sums that skip L1: other SMs wrote them."""
    return cute.make_copy_atom(
        cute.nvgpu.CopyG2ROp(),
        dtype,
        num_bits_per_copy=128,
        load_cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL,
    )


def _vectors(partial: cute.Tensor, first: int, count: int, threads: int) -> cute.Tensor:
    """Vectors [first, first + count) of one thread's partial sums (`partial`, shaped
    (4, values / 4)), as a (4, count) tensor."""
    return cute.make_tensor(
        partial.iterator + first * 4 * threads,
        cute.make_layout((4, count), stride=(1, 4 * threads)),
    )


@cute.jit
def store_partial(values: cute.Tensor, tile: SharedTile, slot: Int32, first: int, total: int):
    """Write `values` (registers) as floats [first, first + size) of this thread's `total`
    partial sums of the tile in `slot`. A kernel that holds its accumulators a part at a time
    (in tensor memory) publishes them part by part, then calls `signal_arrival`."""
    count = cute.size(values)
    regs = cute.make_tensor(values.iterator, cute.make_layout((4, count // 4)))
    store = cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), tile.dtype, num_bits_per_copy=128)
    partial = _partials(tile, total)[((None, None, tile.thread), slot)]
    cute.copy(store, regs, _vectors(partial, first // 4, count // 4, tile.threads))


@cute.jit
def signal_arrival(tile: SharedTile):
    """Count this item in at the tile's counter, once the group's partials are written."""
    tile.barrier.arrive_and_wait()
    if tile.thread == 0:
        # release the group's partials (ordered before us by the barrier) to the readers; a
        # reduction, not an atomic, so the warp does not wait for the old value to come back
        cute.arch.fence_acq_rel_gpu()
        cute.arch.red(
            tile.counters.iterator + tile.counter,
            Int32(1),
            op="add",
            dtype="s32",
            sem="relaxed",
            scope="gpu",
        )


@cute.jit
def publish_partial(accumulators: cute.Tensor, tile: SharedTile, slot: Int32):
    """Write this item's partial sums to `slot` and count it in at the tile's counter."""
    values = cute.size(accumulators)
    store_partial(accumulators, tile, slot, 0, values)
    signal_arrival(tile)


@cute.jit
def await_partials(tile: SharedTile):
    """The owner's wait for the tile's other `segments - 1` items; it resets the counter."""
    _await_arrivals(tile, tile.segments - 1)
    if tile.thread == 0:
        cute.arch.store(tile.counters.iterator + tile.counter, Int32(0), sem="relaxed", scope="gpu")


def gather_chunk(count: int, spare_registers: int = 0) -> int:
    """Floats of one partial a thread of `add_partials` loads at once, of its `count`: the
    largest multiple of four dividing `count` within `MAX_CHUNK` and the registers beyond
    `SHARE_STEP_MARGIN` of its `spare_registers` (see `share_step`), and never fewer than
    `gcd(count, MAX_CHUNK)`, which fits beside any tile. Each chunk is a round trip to L2
    that the owner waits for: 72 accumulators a thread (128x144 cooperative) in chunks of
    their greatest power-of-two divisor, 8, were nine round trips per partial; in 36, two."""
    least = math.gcd(count, MAX_CHUNK)
    room = min(MAX_CHUNK, spare_registers - SHARE_STEP_MARGIN)
    return max(c for c in range(least, max(room, least) + 1, 4) if count % c == 0)


@cute.jit
def add_partials(
    values: cute.Tensor,
    tile: SharedTile,
    first: int,
    total: int,
    spare_registers: cutlass.Constexpr = 0,
):
    """Add to `values` (registers: floats [first, first + size) of this thread's `total`) the
    same floats of the other segments' partials, in segment order, skipping our own, a
    `gather_chunk` at a time. Only after `await_partials`."""
    count = cute.size(values)
    load = _partial_load_atom(tile.dtype)
    partials = _partials(tile, total)
    chunk = gather_chunk(count, spare_registers)
    vectors = chunk // 4
    partial = cute.make_rmem_tensor((4, vectors), tile.dtype)
    for c in cutlass.range_constexpr(count // chunk):
        sum_view = cute.make_tensor(values.iterator + c * chunk, cute.make_layout((4, vectors)))
        for other in range(tile.segments):
            if other != tile.segment:
                source = partials[((None, None, tile.thread), tile.slot(other))]
                cute.copy(
                    load, _vectors(source, (first + c * chunk) // 4, vectors, tile.threads), partial
                )
                sum_view.store(sum_view.load() + partial.load())


@cute.jit
def gather_partials(
    accumulators: cute.Tensor, tile: SharedTile, spare_registers: cutlass.Constexpr = 0
):
    """Wait for the tile's other `segments - 1` items, then add their partials to the
    accumulators, in segment order, skipping our own segment. `spare_registers`: see
    `gather_chunk`."""
    await_partials(tile)
    add_partials(accumulators, tile, 0, cute.size(accumulators), spare_registers)


#: Accumulators per thread up to which a tile is small: a thread of it holds a few blocks, and
#: split many ways, at most one of them falls in a share.
SMALL_TILE_VALUES = 32


#: Registers a consumer thread keeps free beside `share_step`'s loads in flight (addresses,
#: sums, predicates): with less, the compile test of every split-K tile found spills.
SHARE_STEP_MARGIN = 32


def share_step(values: int, spare_registers: int = 0) -> tuple[int, int]:
    """(blocks, partials) a thread of `reduce_share` loads at a time, before adding them in
    segment order. A small tile's thread sums one block, from eight partials at a time: a share
    of one block over 16 splits waits for two round trips to L2, not 16. A larger tile's takes
    two blocks from as many partials (eight or four) as its `spare_registers` (the consumer's
    registers beyond its accumulators and overhead: the accumulators stay live across items)
    hold with `SHARE_STEP_MARGIN` to spare, and from two at the least: four loads in 24
    registers, which a promoted fp8 128x128 tile's two register tiles leave room for."""
    if values <= SMALL_TILE_VALUES:
        return (1, 8)
    for partials in (8, 4):
        if 2 * 4 * partials + SHARE_STEP_MARGIN <= spare_registers:
            return (2, partials)
    return (2, 2)


@cute.jit
def reduce_share(
    values: cutlass.Constexpr,
    tile: SharedTile,
    tCgC: cute.Tensor,
    tCcC: cute.Tensor,
    extent_mn: tuple,
    out_dtype: cutlass.Constexpr,
    spare_registers: cutlass.Constexpr = 0,
    bias: cute.Tensor | None = None,
    bias_origin: Int32 = 0,
    bias_axis: cutlass.Constexpr = 1,
):
    """Wait until all `segments` partials of the tile are published, then write this segment's
    share of the tile, summed over the partials in segment order. The tile's blocks of four
    floats are numbered as the workspace stores them (block b of thread t is vector
    b * threads + t) and cut into `segments` near-equal ranges, so every segment has a share
    even when a thread holds fewer blocks than there are splits; a thread sums the blocks of
    its own positions in its segment's range (`schedule_model.share_blocks`), so its loads are
    coalesced with its neighbours' and `tCgC` / `tCcC` (its partition of the output tile and of
    the tile's coordinates, indexed by position) say where each value goes. The last segment
    to leave resets the counter. `spare_registers`: see `share_step`. `bias`, where given, is
    the tile's bias slice in shared memory (`kernels/bias.py`), from `bias_origin` along the
    output's `bias_axis` (0: rows, 1: columns); it is added to the summed share."""
    blocks = values // 4
    _await_arrivals(tile, tile.segments)
    load = _partial_load_atom(tile.dtype)
    partials = _partials(tile, values)
    begin, end = share_blocks(tile.segment, tile.segments, blocks, tile.threads, tile.thread)
    step_blocks, step_partials = share_step(values, spare_registers)
    sums = cute.make_rmem_tensor((4, step_blocks), tile.dtype)
    loaded = cute.make_rmem_tensor((4, step_blocks, step_partials), tile.dtype)
    out = cute.make_rmem_tensor((4,), out_dtype)
    for first in range(begin, end, step_blocks):
        sums.fill(0)
        for j in range(0, tile.segments, step_partials):
            for p in cutlass.range_constexpr(step_partials):
                if j + p < tile.segments:
                    source = partials[((None, None, tile.thread), tile.slot(j + p))]
                    for g in cutlass.range_constexpr(step_blocks):
                        if first + g < end:
                            cute.copy(load, source[(None, first + g)], loaded[(None, g, p)])
            for p in cutlass.range_constexpr(step_partials):
                if j + p < tile.segments:
                    sums.store(sums.load() + loaded[(None, None, p)].load())
        for g in cutlass.range_constexpr(step_blocks):
            if first + g < end:
                if cutlass.const_expr(bias is not None):
                    for v in cutlass.range_constexpr(4):
                        along = tCcC[(first + g) * 4 + v][bias_axis]
                        sums[v, g] = sums[v, g] + bias[along - bias_origin]
                out.store(sums[(None, g)].load().to(out_dtype))
                for v in cutlass.range_constexpr(4):
                    index = (first + g) * 4 + v
                    coord = tCcC[index]
                    if coord[0] < extent_mn[0] and coord[1] < extent_mn[1]:
                        tCgC[index] = out[v]
    tile.barrier.arrive_and_wait()
    if tile.thread == 0:
        counter = tile.counters.iterator + tile.counter
        left = cute.arch.atomic_add(counter, Int32(1), sem="relaxed", scope="gpu")
        if left == 2 * tile.segments - 1:
            cute.arch.store(counter, Int32(0), sem="relaxed", scope="gpu")
