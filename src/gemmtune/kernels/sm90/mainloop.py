"""Hopper mainloop: a TMA producer warp filling a ring of A/B stages, WGMMA consumers draining it.

The two sides meet in a `PipelineTmaAsync` (one full and one empty mbarrier per stage). The
producer loads the k-tiles of every item its CTA computes, in the order its scheduler gives;
consumers take them in the same order. With clusters, each CTA loads a slice of an A (B) tile
and multicasts it to the CTAs of its cluster row (column).
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from gemmtune.kernels.scheduler import TileScheduler, cluster_index


@cute.jit
def produce(
    ab_pipeline: pipeline.PipelineTmaAsync,
    scheduler: TileScheduler,
    cta_in_cluster: tuple,
    tma_atom_a: cute.CopyAtom,
    tAgA: cute.Tensor,
    tAsA: cute.Tensor,
    a_mcast_mask,
    tma_atom_b: cute.CopyAtom,
    tBgB: cute.Tensor,
    tBsB: cute.Tensor,
    b_mcast_mask,
    a_multicast: cutlass.Constexpr,
    b_multicast: cutlass.Constexpr,
    num_stages: cutlass.Constexpr,
    dependent_launch: cutlass.Constexpr,
    early_operand: cutlass.Constexpr = None,
):
    """Load the k-tiles of every item of this CTA's cluster, in order; run by one warp.

    With `dependent_launch` the loads wait until the kernel before ours has finished
    (`griddepcontrol.wait`). `early_operand` ("a" or "b": an operand no kernel before ours
    writes) is loaded into the first item's first stages before that wait, the other operand
    after it."""
    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, num_stages)
    cluster = cluster_index()
    position = scheduler.first_position(cluster)
    early = Int32(0)
    if cutlass.const_expr(early_operand is not None):
        # names of their own: the DSL carries a name assigned before the loop below into it
        first_unit, first_k, first_end, *_ = scheduler.item(position, cluster)
        first_m, first_n, first_batch = scheduler.tile_of_unit(first_unit, cta_in_cluster)
        early_loads = (tma_atom_a, tAgA[(None, first_m, None, first_batch)], tAsA, a_mcast_mask)
        late_loads = (tma_atom_b, tBgB[(None, first_n, None, first_batch)], tBsB, b_mcast_mask)
        if cutlass.const_expr(early_operand == "b"):
            early_loads, late_loads = late_loads, early_loads
        has_item = Int32(scheduler.valid(position, cluster))
        early = cutlass.min(first_end - first_k, num_stages) * has_item
        for i in range(early):
            ab_pipeline.producer_acquire(state)
            _load(early_loads, first_k + i, state.index, ab_pipeline.producer_get_barrier(state))
            state.advance()
    if cutlass.const_expr(dependent_launch):
        cute.arch.griddepcontrol_wait()
    if cutlass.const_expr(early_operand is not None):
        armed = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, num_stages)
        for i in range(early):
            _load(late_loads, first_k + i, armed.index, ab_pipeline.producer_get_barrier(armed))
            armed.advance()
    while scheduler.valid(position, cluster):
        unit, k_begin, k_end, *_, next_position = scheduler.item(position, cluster)
        tile_m, tile_n, batch = scheduler.tile_of_unit(unit, cta_in_cluster)
        tAgA_tile = tAgA[(None, tile_m, None, batch)]
        tBgB_tile = tBgB[(None, tile_n, None, batch)]
        empty = ab_pipeline.producer_try_acquire(state)
        for k_tile in range(k_begin + early, k_end):
            # waits for the stage to be empty (unless the early test saw it so), then arms its
            # full barrier with the byte count
            ab_pipeline.producer_acquire(state, empty)
            full = ab_pipeline.producer_get_barrier(state)
            stage = state.index
            load_a = (tma_atom_a, tAgA_tile[(None, k_tile)], tAsA[(None, stage)], a_mcast_mask)
            load_b = (tma_atom_b, tBgB_tile[(None, k_tile)], tBsB[(None, stage)], b_mcast_mask)
            # The operand shared by more CTAs goes first: the partner CTAs' stages complete
            # only when its slices arrive.
            first, second = load_a, load_b
            if cutlass.const_expr(b_multicast > a_multicast):
                first, second = load_b, load_a
            cute.copy(first[0], first[1], first[2], tma_bar_ptr=full, mcast_mask=first[3])
            cute.copy(second[0], second[1], second[2], tma_bar_ptr=full, mcast_mask=second[3])
            ab_pipeline.producer_commit(state)
            state.advance()
            # peek within the item only (see `mma_tile`): the next item tests again
            empty = cutlass.Boolean(False)
            if k_tile + 1 < k_end:
                empty = ab_pipeline.producer_try_acquire(state)
        position = next_position
        early = Int32(0)
    # do not exit while peers may still arrive on this CTA's empty barriers
    ab_pipeline.producer_tail(state)


@cute.jit
def _load(loads: tuple, k_tile: Int32, stage: Int32, full):
    """One operand's k-tile `k_tile` into `stage`: `loads` is (TMA atom, the tile's k-tiles in
    global memory, the stages, multicast mask)."""
    atom, tiles, stages, mask = loads
    cute.copy(atom, tiles[(None, k_tile)], stages[(None, stage)], tma_bar_ptr=full, mcast_mask=mask)


@cute.jit
def mma_tile(
    ab_pipeline: pipeline.PipelineTmaAsync,
    read_state: pipeline.PipelineState,
    tiled_mma: cute.TiledMma,
    accumulators: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    k_tiles: Int32,
):
    """Accumulate one tile over all its k-tiles; `read_state` ends on the next tile's first.

    One WGMMA batch (a k-tile) stays in flight: after issuing k-tile i the warpgroup waits for
    k-tile i-1 to retire and only then frees its stage. The next k-tile's barrier is tested
    before that wait, so its latency hides behind the tensor cores; but only within the tile.
    The test is a try-wait, which suspends the warpgroup until the stage is full or a
    hardware time limit passes: tested past the tile's last k-tile, it would hold the epilogue
    for the next tile's loads, and after a CTA's last tile (whose next stage never fills) for
    the whole limit. Returns the states to pass on (the next read, and the stage still to be
    freed).
    """
    num_k_blocks = cute.size(tCrA, mode=[2])
    release_state = read_state.clone()
    # Where a warpgroup issues several WGMMAs per k-block (128 rows or more of it), ptxas
    # turns a zero-fill into register moves and makes the second WGMMA wait for the first,
    # every tile; there the first k-block's WGMMAs start from zero instead (scale-d 0). With
    # one WGMMA per k-block ptxas folds the fill into it, and the flag would cost registers
    # (192x144 direct-store configs spill with it).
    zero_by_flag = cute.size(tCrA, mode=[1]) > 1
    if cutlass.const_expr(not zero_by_flag):
        accumulators.fill(0.0)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)

    ab_pipeline.consumer_wait(read_state)
    cute.nvgpu.warpgroup.fence()
    for k_block in cutlass.range_constexpr(num_k_blocks):
        if cutlass.const_expr(zero_by_flag):
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, k_block != 0)
        coord = (None, None, k_block, read_state.index)
        cute.gemm(tiled_mma, accumulators, tCrA[coord], tCrB[coord], accumulators)
    cute.nvgpu.warpgroup.commit_group()
    read_state.advance()
    full = cutlass.Boolean(False)
    if k_tiles > 1:
        full = ab_pipeline.consumer_try_wait(read_state)

    for k_tile in range(1, k_tiles):
        ab_pipeline.consumer_wait(read_state, full)
        cute.nvgpu.warpgroup.fence()
        for k_block in cutlass.range_constexpr(num_k_blocks):
            coord = (None, None, k_block, read_state.index)
            cute.gemm(tiled_mma, accumulators, tCrA[coord], tCrB[coord], accumulators)
        cute.nvgpu.warpgroup.commit_group()
        read_state.advance()
        full = cutlass.Boolean(False)
        if k_tile + 1 < k_tiles:
            full = ab_pipeline.consumer_try_wait(read_state)
        cute.nvgpu.warpgroup.wait_group(1)
        ab_pipeline.consumer_release(release_state)
        release_state.advance()
    return read_state, release_state


@cute.jit
def _issue_step(
    ab_pipeline: pipeline.PipelineTmaAsync,
    read_state: pipeline.PipelineState,
    tiled_mma: cute.TiledMma,
    partials: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    part: cutlass.Constexpr,
    parts: cutlass.Constexpr,
):
    """Issue the WGMMAs of promotion step `part` of the `parts` a stage holds into `partials`,
    from zero, waiting for the stage at `read_state` before its first step; returns the read
    state (advanced after the stage's last step) and the MMA (whose accumulate field it set),
    which the caller rebinds: the DSL carries values across its loops through plain local
    variables only, not through objects a helper changed."""
    if cutlass.const_expr(part == 0):
        ab_pipeline.consumer_wait(read_state)
    cute.nvgpu.warpgroup.fence()
    blocks = cute.size(tCrA, mode=[2]) // parts
    for k_block in cutlass.range_constexpr(blocks):
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, k_block != 0)
        coord = (None, None, part * blocks + k_block, read_state.index)
        cute.gemm(tiled_mma, partials, tCrA[coord], tCrB[coord], partials)
    cute.nvgpu.warpgroup.commit_group()
    if cutlass.const_expr(part == parts - 1):
        read_state.advance()
    return read_state, tiled_mma


@cute.jit
def _retire_step(
    ab_pipeline: pipeline.PipelineTmaAsync,
    release_state: pipeline.PipelineState,
    accumulators: cute.Tensor,
    partials: cute.Tensor,
    in_flight: cutlass.Constexpr,
    last_of_stage: cutlass.Constexpr,
):
    """Once at most `in_flight` steps' WGMMAs are still running, add the oldest step's
    `partials` to the fp32 `accumulators`, and free its stage where it was the stage's last
    step; returns the next stage to free."""
    cute.nvgpu.warpgroup.wait_group(in_flight)
    if cutlass.const_expr(last_of_stage):
        ab_pipeline.consumer_release(release_state)
        release_state.advance()
    accumulators.store(accumulators.load() + partials.load())
    return release_state


@cute.jit
def mma_tile_promoted(
    ab_pipeline: pipeline.PipelineTmaAsync,
    read_state: pipeline.PipelineState,
    tiled_mma: cute.TiledMma,
    accumulators: cute.Tensor,
    partials: tuple,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    k_tiles: Int32,
    parts: cutlass.Constexpr,
):
    """`mma_tile` with fp8 promotion: the WGMMAs of each promotion step (128 elements of K; a
    stage holds `parts` of them, `rules.promotion_steps`) sum into a register tile of partial
    sums (from zero), which is then added to the fp32 `accumulators`, so the tensor cores'
    reduced-precision sums span 128 elements only, as cuBLAS does without fast accumulation.
    The addition needs the step's WGMMAs retired. `partials` holds `rules.promotion_buffers`
    such tiles: with one, each step waits for the one before; with two per step of a stage,
    consecutive stages alternate between two sets of them, so one stage's WGMMAs run while
    the other's sums are added; two-step stages with one pair drain before each stage's first
    step (below). A stage is freed after its last step (no `drain`). Returns the next read
    state."""
    accumulators.fill(0.0)
    release_state = read_state.clone()
    if cutlass.const_expr(len(partials) == 1):
        for _ in range(k_tiles):
            for part in cutlass.range_constexpr(parts):
                read_state, tiled_mma = _issue_step(
                    ab_pipeline, read_state, tiled_mma, partials[0], tCrA, tCrB, part, parts
                )
                release_state = _retire_step(
                    ab_pipeline, release_state, accumulators, partials[0], 0, part == parts - 1
                )
    elif cutlass.const_expr(len(partials) == 2 * parts):
        # consecutive stages alternate between two sets of `parts` tiles; a stage's sums are
        # added once the next stage's steps are issued (`parts` groups left in flight)
        even, odd = partials[:parts], partials[parts:]
        read_state, tiled_mma = _issue_stage(ab_pipeline, read_state, tiled_mma, even, tCrA, tCrB)
        for _ in range((k_tiles - 1) // 2):
            read_state, tiled_mma = _issue_stage(
                ab_pipeline, read_state, tiled_mma, odd, tCrA, tCrB
            )
            release_state = _retire_stage(ab_pipeline, release_state, accumulators, even, parts)
            read_state, tiled_mma = _issue_stage(
                ab_pipeline, read_state, tiled_mma, even, tCrA, tCrB
            )
            release_state = _retire_stage(ab_pipeline, release_state, accumulators, odd, parts)
        if (k_tiles - 1) % 2 == 1:
            read_state, tiled_mma = _issue_stage(
                ab_pipeline, read_state, tiled_mma, odd, tCrA, tCrB
            )
            release_state = _retire_stage(ab_pipeline, release_state, accumulators, even, parts)
            release_state = _retire_stage(ab_pipeline, release_state, accumulators, odd, 0)
        else:
            release_state = _retire_stage(ab_pipeline, release_state, accumulators, even, 0)
    else:
        # two-step stages in one pair of tiles: a stage's first step in one, its second in
        # the other. The first step is added once both are retired: waiting for it alone (one
        # group left in flight), ptxas (C7514) finds the second step's tile read within its
        # pipeline stage and serializes every WGMMA of the kernel, which ran decode tiles
        # 10-90 % slower
        first, second = partials
        read_state, tiled_mma = _issue_step(
            ab_pipeline, read_state, tiled_mma, first, tCrA, tCrB, 0, 2
        )
        for _ in range(k_tiles - 1):
            read_state, tiled_mma = _issue_step(
                ab_pipeline, read_state, tiled_mma, second, tCrA, tCrB, 1, 2
            )
            release_state = _retire_step(ab_pipeline, release_state, accumulators, first, 0, False)
            read_state, tiled_mma = _issue_step(
                ab_pipeline, read_state, tiled_mma, first, tCrA, tCrB, 0, 2
            )
            release_state = _retire_step(ab_pipeline, release_state, accumulators, second, 1, True)
        read_state, tiled_mma = _issue_step(
            ab_pipeline, read_state, tiled_mma, second, tCrA, tCrB, 1, 2
        )
        release_state = _retire_step(ab_pipeline, release_state, accumulators, first, 1, False)
        release_state = _retire_step(ab_pipeline, release_state, accumulators, second, 0, True)
    return read_state


@cute.jit
def _issue_stage(
    ab_pipeline: pipeline.PipelineTmaAsync,
    read_state: pipeline.PipelineState,
    tiled_mma: cute.TiledMma,
    tiles: tuple,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
):
    """Issue every promotion step of the stage at `read_state`, step i into `tiles[i]`, each
    its own group; returns what `_issue_step` returns."""
    for part in cutlass.range_constexpr(len(tiles)):
        read_state, tiled_mma = _issue_step(
            ab_pipeline, read_state, tiled_mma, tiles[part], tCrA, tCrB, part, len(tiles)
        )
    return read_state, tiled_mma


@cute.jit
def _retire_stage(
    ab_pipeline: pipeline.PipelineTmaAsync,
    release_state: pipeline.PipelineState,
    accumulators: cute.Tensor,
    tiles: tuple,
    in_flight: cutlass.Constexpr,
):
    """Once at most `in_flight` groups are still running, add every step of the oldest stage
    (`tiles`) and free it; returns the next stage to free."""
    for part in cutlass.range_constexpr(len(tiles)):
        release_state = _retire_step(
            ab_pipeline,
            release_state,
            accumulators,
            tiles[part],
            in_flight,
            part == len(tiles) - 1,
        )
    return release_state


@cute.jit
def drain(ab_pipeline: pipeline.PipelineTmaAsync, release_state: pipeline.PipelineState):
    """Wait for the last WGMMA batch and free its stage."""
    cute.nvgpu.warpgroup.wait_group(0)
    ab_pipeline.consumer_release(release_state)
