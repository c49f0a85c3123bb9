"""The turnstile that sums the partial accumulators of a shared tile, deterministically.

Several items (split-K splits, stream-K segments) compute parts of one output tile. They meet
in a workspace slot: a tile of fp32 partial sums and an int32 flag, which is 0 between
launches. Item `rank` r waits until the flag reads r, adds the partial sum to its own
accumulators, and, unless it is the last, writes the sum back and raises the flag to r + 1.
The last item lowers the flag to 0 again (so the next launch needs no memset) and goes on to
the epilogue. The order of the additions is fixed, so the result never depends on timing.

Partial tiles are stored in the accumulators' register order, interleaved by thread
(float4 v of thread t at ((v * threads) + t) * 4), so each store and load is 16 bytes per
thread and coalesced across the warp.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32


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
    flags: cute.Tensor,
    slot: Int32,
    rank: Int32,
    segments: Int32,
    thread: Int32,
    threads: cutlass.Constexpr,
    barrier: pipeline.NamedBarrier,
):
    """Take this item's turn at tile `slot`; the accumulators of the last item end up holding
    the whole sum. `thread` counts from 0 among the `threads` that hold the tile."""
    values = cute.size(accumulators)
    mine = _partials(workspace, values, threads)[((None, None, thread), slot)]
    acc = cute.make_tensor(accumulators.iterator, cute.make_layout((4, values // 4)))
    flag = flags.iterator + slot
    if rank > 0:
        if thread == 0:
            seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
            while seen != rank:
                seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
        barrier.arrive_and_wait()
        load = cute.make_copy_atom(
            cute.nvgpu.CopyG2ROp(),
            cutlass.Float32,
            num_bits_per_copy=128,
            load_cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL,  # skip L1: another SM wrote it
        )
        partial = cute.make_rmem_tensor((4, values // 4), cutlass.Float32)
        cute.copy(load, mine, partial)
        acc.store(acc.load() + partial.load())
    if rank < segments - 1:
        store = cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), cutlass.Float32, num_bits_per_copy=128)
        cute.copy(store, acc, mine)
        barrier.arrive_and_wait()
        if thread == 0:
            cute.arch.fence_acq_rel_gpu()
            cute.arch.store(flag, rank + 1, sem="release", scope="gpu")
    elif thread == 0:
        cute.arch.store(flag, Int32(0), sem="relaxed", scope="gpu")
