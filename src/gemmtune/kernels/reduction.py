"""Summing the partial accumulators of a shared tile, deterministically, without waiting.

Several items (split-K splits, stream-K segments) compute parts of one output tile. Each writes
its partial sums to its own workspace slot and counts itself in at the tile's arrival counter
(an int32, 0 between launches). The item that arrives last adds all the partials up in
segment (k) order, resets the counter to 0 (so the next launch needs no memset) and goes on to
the epilogue; the others are done. Nobody waits, and the order of the additions is fixed, so
the result never depends on timing.

Partial tiles are stored in the accumulators' register order, interleaved by thread
(float4 v of thread t at ((v * threads) + t) * 4), so each store and load is 16 bytes per
thread and coalesced across the warp.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

#: floats of the sum one thread builds at a time: registers for the loads in flight
SUM_CHUNK = 64


def _partials(workspace: cute.Tensor, values: int, threads: int) -> cute.Tensor:
    """The workspace as ((4, values/4, threads), slot): one tile of partial sums per slot."""
    tile = values * threads
    layout = cute.make_layout(
        ((4, values // 4, threads), cute.size(workspace) // tile),
        stride=((1, 4 * threads, 4), tile),
    )
    return cute.make_tensor(workspace.iterator, layout)


@cute.jit
def reduce_partials(
    accumulators: cute.Tensor,
    workspace: cute.Tensor,
    counters: cute.Tensor,
    partial_slot: Int32,
    first_slot: Int32,
    slot_stride: cutlass.Constexpr,
    counter: Int32,
    segments: Int32,
    thread: Int32,
    threads: cutlass.Constexpr,
    barrier: pipeline.NamedBarrier,
    is_last_flag: cute.Tensor,
):
    """This item's part of the reduction; when it arrives last, its accumulators end up
    holding the tile's whole sum. `thread` counts from 0 among the `threads` that hold the
    tile; `is_last_flag` is one int32 of shared memory that tells them all the verdict. The
    partials of segment j sit in slot `first_slot + j * slot_stride`."""
    values = cute.size(accumulators)
    partials = _partials(workspace, values, threads)
    acc = cute.make_tensor(accumulators.iterator, cute.make_layout((4, values // 4)))
    store = cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), cutlass.Float32, num_bits_per_copy=128)
    cute.copy(store, acc, partials[((None, None, thread), partial_slot)])
    barrier.arrive_and_wait()
    if thread == 0:
        # release our partials (and, through the barrier, the group's) to the last arriver
        cute.arch.fence_acq_rel_gpu()
        arrived = cute.arch.atomic_add(
            counters.iterator + counter, Int32(1), sem="acq_rel", scope="gpu"
        )
        is_last_flag[0] = Int32(arrived == segments - 1)
        if arrived == segments - 1:
            cute.arch.store(counters.iterator + counter, Int32(0), sem="relaxed", scope="gpu")
    barrier.arrive_and_wait()
    is_last = is_last_flag[0] == 1
    if is_last:
        load = cute.make_copy_atom(
            cute.nvgpu.CopyG2ROp(),
            cutlass.Float32,
            num_bits_per_copy=128,
            load_cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL,  # skip L1: other SMs wrote them
        )
        chunk = min(SUM_CHUNK, values)
        vectors = chunk // 4
        partial = cute.make_rmem_tensor((4, vectors), cutlass.Float32)
        for c in cutlass.range_constexpr(values // chunk):
            sum_view = cute.make_tensor(
                accumulators.iterator + c * chunk, cute.make_layout((4, vectors))
            )
            sum_view.fill(0.0)
            for segment in range(segments):
                source = partials[((None, None, thread), first_slot + segment * slot_stride)]
                cute.copy(
                    load,
                    cute.make_tensor(
                        source.iterator + c * vectors * 4 * threads,
                        cute.make_layout((4, vectors), stride=(1, 4 * threads)),
                    ),
                    partial,
                )
                sum_view.store(sum_view.load() + partial.load())
    return is_last
