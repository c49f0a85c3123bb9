"""The Hopper kernel's consumer warpgroups: every work item from mainloop to output.

For each item of its CTA's sequence a consumer warpgroup runs the WGMMA mainloop
(`sm90/mainloop.py`), applies an fp8 product's scales (`kernels/scaling.py`), sums the partials
of a tile that several items share (split-K, stream-K: `kernels/reduction.py`), adds a bias
(`kernels/bias.py`) and stores the tile through the epilogue (`sm90/epilogue.py`). Ping-pong
warpgroups take alternate items, and named barriers order their mainloops and their epilogues
(they share the epilogue's shared memory), so one's epilogue overlaps the other's mainloop.
"""

from typing import TYPE_CHECKING

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Int32
from cutlass.cute.nvgpu import warp
from cutlass.memory import SmemAllocator

from gemmtune.kernels import scheduler as sched
from gemmtune.kernels.bias import (
    add_bias,
    add_row_bias,
    load_row_bias,
    load_tile_bias,
    stage_tile_bias,
)
from gemmtune.kernels.reduction import (
    SharedTile,
    gather_partials,
    publish_partial,
    reduce_share,
)
from gemmtune.kernels.scaling import (
    scale_accumulators,
    stage_tile_scales,
    tensor_scale_factor,
    wait_tile_scales,
)
from gemmtune.kernels.sm90 import mainloop, rules
from gemmtune.kernels.sm90.epilogue import StagedEpilogue

if TYPE_CHECKING:
    from gemmtune.kernels.sm90.kernel import HopperGemm

# Named barrier ids (0 is __syncthreads): one epilogue barrier per consumer group, then the
# ping-pong order barriers, one per warpgroup and per stage.
EPILOGUE_BARRIER = 1
MMA_ORDER_BARRIER = 3
EPILOGUE_ORDER_BARRIER = 5


@cute.jit
def consume(
    gemm: "HopperGemm",
    ab_pipeline: pipeline.PipelineTmaAsync,
    scheduler: sched.TileScheduler,
    cta_in_cluster: tuple,
    tiled_mma: cute.TiledMma,
    sA: cute.Tensor,
    sB: cute.Tensor,
    smem: SmemAllocator,
    epi_smem: cute.ComposedLayout,
    store_atom: cute.CopyAtom,
    store_target: cute.Tensor,
    mC: cute.Tensor,
    row_scale: cute.Tensor | None,
    col_scale: cute.Tensor | None,
    bias: cute.Tensor | None,
    workspace: cute.Tensor,
    counters: cute.Tensor,
    tidx: Int32,
    warp_idx: Int32,
    consumer: Int32,
):
    """The consumer warpgroups: mainloop, turnstile and epilogue of each of their items.

    Every consumer warpgroup walks the CTA's whole item sequence, the producer's order.
    Cooperative warpgroups compute every item together; a ping-pong warpgroup computes
    every other one and skips the other's k-tiles in the pipeline. `gemm` holds the
    compile-time plan (tile, schedule, dtypes, epilogue stages); `consumer` is the
    warpgroup's index among the consumers.
    """
    wg = rules.THREADS_PER_WARPGROUP
    thread_in_group = tidx - wg
    group_threads = gemm.tile_threads
    barrier_id = EPILOGUE_BARRIER
    store_warp = wg // 32
    if cutlass.const_expr(not gemm.cooperative):
        thread_in_group = (tidx - wg) % wg
        group_threads = wg
        barrier_id = EPILOGUE_BARRIER + consumer
        store_warp = wg // 32 + consumer * (wg // 32)
    is_store_warp = warp_idx == store_warp
    group_barrier = pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=group_threads)

    thr_mma = tiled_mma.get_slice(thread_in_group)
    # The A/B fragments are shared-memory descriptors, one per warpgroup: slicing by the
    # warpgroup's first thread (warp-uniform) keeps their arithmetic in uniform registers;
    # sliced by the thread index, each WGMMA's descriptor is rebuilt in vector registers
    # every k-tile.
    group_first_thread = 0
    if cutlass.const_expr(gemm.cooperative):
        group_first_thread = consumer * wg
    wg_mma = tiled_mma.get_slice(group_first_thread)
    tCrA = tiled_mma.make_fragment_A(wg_mma.partition_A(sA))
    tCrB = tiled_mma.make_fragment_B(wg_mma.partition_B(sB))
    tile_m, tile_n, _ = gemm.tile_shape_mnk
    # the output's tiles as the store addresses them (TMA: its coordinates), and in memory
    gC_store = cute.local_tile(store_target, (tile_m, tile_n), (None, None, None))
    gC = cute.local_tile(mC, (tile_m, tile_n), (None, None, None))  # (bM,bN,RM,RN,L)
    accumulators = cute.make_rmem_tensor(
        thr_mma.partition_C(gC[(None, None, 0, 0, 0)]).shape, gemm.acc_dtype
    )
    if cutlass.const_expr(gemm.promoted):
        partials = tuple(
            cute.make_rmem_tensor(accumulators.shape, gemm.acc_dtype)
            for _ in range(rules.promotion_buffers(gemm.config))
        )
    cluster_ctas = gemm.cluster_shape_mn[0] * gemm.cluster_shape_mn[1]
    cta_rank = cta_in_cluster[0] + cta_in_cluster[1] * gemm.cluster_shape_mn[0]

    sC = smem.allocate_tensor(gemm.out_dtype, epi_smem.outer, 1024, swizzle=epi_smem.inner)
    # four 8x8 matrices cover 16 columns; a tile of an odd number of 8-column blocks
    # (`rules.ODD_EIGHT_TILE_NS`) moves sub-tiles 8 wide, two matrices at a time
    matrices = 4 if tile_n % 16 == 0 else 2
    stmatrix = cute.make_copy_atom(
        warp.StMatrix8x8x16bOp(gemm.c_layout.is_m_major_c(), matrices), cutlass.Float16
    )
    if cutlass.const_expr(matrices == 4 or gemm.out_dtype.width != 16):
        store_r2s = sm90_utils.sm90_get_smem_store_op(gemm.c_layout, gemm.out_dtype, gemm.acc_dtype)
    else:  # the DSL's helper stores four matrices at a time
        store_r2s = cute.make_copy_atom(
            warp.StMatrix8x8x16bOp(gemm.c_layout.is_m_major_c(), matrices), gemm.out_dtype
        )
    epilogue = StagedEpilogue.create(
        tiled_mma,
        store_r2s,
        stmatrix,
        sC,
        gemm.epi_tile,
        gemm.epi_stages,
        gemm.epi_group,
        thread_in_group,
        group_threads,
        barrier_id,
        gemm.out_dtype,
        gemm.config.tma_store,
        gemm.c_layout.is_m_major_c(),
    )
    scale_buffer = None
    tile_coords = None
    if cutlass.const_expr(gemm.per_row):
        groups = 1 if gemm.cooperative else gemm.consumers
        scale_buffers = smem.allocate_tensor(
            cutlass.Float32, cute.make_layout((tile_m + tile_n, groups)), 16
        )
        group = 0 if gemm.cooperative else consumer
        scale_buffer = scale_buffers[(None, group)]
        tile_coords = thr_mma.partition_C(cute.make_identity_tensor((tile_m, tile_n)))
    coords = cute.local_tile(
        cute.make_identity_tensor(mC.shape), (tile_m, tile_n), (None, None, None)
    )
    bias_buffer = None
    bias_coords = None
    bias_length = tile_m if gemm.bias_along_m else tile_n
    bias_extent = mC.shape[0] if gemm.bias_along_m else mC.shape[1]
    stages_bias = gemm.adds_bias and not gemm.row_bias_in_registers
    if cutlass.const_expr(gemm.adds_bias):
        bias_coords = thr_mma.partition_C(cute.make_identity_tensor((tile_m, tile_n)))
    if cutlass.const_expr(stages_bias):
        groups = 1 if gemm.cooperative else gemm.consumers
        bias_buffers = smem.allocate_tensor(
            cutlass.Float32, cute.make_layout((bias_length, groups)), 16
        )
        bias_buffer = bias_buffers[(None, 0 if gemm.cooperative else consumer)]

    tensor_factor = cutlass.Float32(1.0)
    if cutlass.const_expr(gemm.applies_scales and not gemm.per_row):
        # before the first mainloop, so the loads' latency hides behind the pipeline's fill
        tensor_factor = tensor_scale_factor(row_scale, col_scale)

    read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, gemm.ab_stages)
    cluster = sched.cluster_index()
    if cutlass.const_expr(not gemm.cooperative):
        if consumer == 1:
            # warpgroup 0 goes first in both orders
            cute.arch.barrier_arrive(barrier_id=MMA_ORDER_BARRIER, number_of_threads=2 * wg)
            cute.arch.barrier_arrive(barrier_id=EPILOGUE_ORDER_BARRIER, number_of_threads=2 * wg)
    position = scheduler.first_position(cluster)
    item_index = Int32(0)
    tiles_stored = Int32(0)
    while scheduler.valid(position, cluster):
        (
            unit,
            k_begin,
            k_end,
            segment,
            segments,
            partial_slot,
            first_slot,
            counter,
            owner,
            next_position,
        ) = scheduler.item(position, cluster)
        mine = True
        if cutlass.const_expr(not gemm.cooperative):
            mine = item_index % 2 == consumer
        if mine:
            tile_m_idx, tile_n_idx, batch = scheduler.tile_of_unit(unit, cta_in_cluster)
            bias_origin = tile_n_idx * tile_n
            if cutlass.const_expr(gemm.bias_along_m):
                bias_origin = tile_m_idx * tile_m
            # loads in flight through the mainloop, waited for after it
            if cutlass.const_expr(stages_bias):
                pending_bias = load_tile_bias(
                    bias, bias_origin, bias_extent, bias_length, thread_in_group, group_threads
                )
            if cutlass.const_expr(gemm.row_bias_in_registers):
                row_terms = load_row_bias(
                    bias, bias_coords, bias_origin, bias_extent, accumulators.shape
                )
            if cutlass.const_expr(not gemm.cooperative):
                cute.arch.barrier(barrier_id=MMA_ORDER_BARRIER + consumer, number_of_threads=2 * wg)
            if cutlass.const_expr(gemm.per_row):
                # The group's threads have all read the buffer's last tile: ping-pong's
                # order barrier just waited for each of them, cooperative warpgroups wait.
                if cutlass.const_expr(gemm.cooperative):
                    group_barrier.arrive_and_wait()
                stage_tile_scales(
                    scale_buffer,
                    row_scale,
                    col_scale,
                    (tile_m, tile_n),
                    (tile_m_idx * tile_m, tile_n_idx * tile_n),
                    (mC.shape[0], mC.shape[1]),
                    thread_in_group,
                    group_threads,
                )
            if cutlass.const_expr(gemm.promoted):
                read_state = mainloop.mma_tile_promoted(
                    ab_pipeline,
                    read_state,
                    tiled_mma,
                    accumulators,
                    partials,
                    tCrA,
                    tCrB,
                    k_end - k_begin,
                    rules.promotion_steps(gemm.config),
                )
            else:
                read_state, release_state = mainloop.mma_tile(
                    ab_pipeline,
                    read_state,
                    tiled_mma,
                    accumulators,
                    tCrA,
                    tCrB,
                    k_end - k_begin,
                )
            if cutlass.const_expr(not gemm.cooperative):
                cute.arch.barrier_arrive(
                    barrier_id=MMA_ORDER_BARRIER + 1 - consumer, number_of_threads=2 * wg
                )
                cute.arch.barrier(
                    barrier_id=EPILOGUE_ORDER_BARRIER + consumer, number_of_threads=2 * wg
                )
            if cutlass.const_expr(not gemm.promoted):
                mainloop.drain(ab_pipeline, release_state)
            if cutlass.const_expr(gemm.applies_scales):
                # scaling is linear: each split's partial is scaled before the reduction
                if cutlass.const_expr(gemm.per_row):
                    wait_tile_scales(group_barrier)
                scale_accumulators(
                    accumulators,
                    tile_coords,
                    tensor_factor,
                    scale_buffer,
                    tile_m,
                    gemm.per_row,
                )
            if cutlass.const_expr(stages_bias):
                stage_tile_bias(
                    bias_buffer,
                    pending_bias,
                    bias_length,
                    thread_in_group,
                    group_threads,
                    group_barrier,
                )
            final = True
            if cutlass.const_expr(gemm.shares_tiles):
                if segments > 1:
                    # slots and counters are per CTA of the cluster
                    shared = SharedTile(
                        workspace,
                        counters,
                        first_slot * cluster_ctas + cta_rank,
                        cluster_ctas,
                        counter * cluster_ctas + cta_rank,
                        segment,
                        segments,
                        thread_in_group,
                        group_threads,
                        group_barrier,
                        gemm.acc_dtype,
                    )
                    if segment != owner:  # every split-K split; stream-K's non-owners
                        publish_partial(
                            accumulators, shared, partial_slot * cluster_ctas + cta_rank
                        )
                    if cutlass.const_expr(gemm.scatters):
                        final = False
                        tile = (None, None, tile_m_idx, tile_n_idx, batch)
                        reduce_share(
                            cute.size(accumulators),
                            shared,
                            thr_mma.partition_C(gC[tile]),
                            thr_mma.partition_C(coords[tile]),
                            (mC.shape[0], mC.shape[1]),
                            gemm.out_dtype,
                            gemm.share_registers,
                            bias_buffer,
                            bias_origin,
                            0 if gemm.bias_along_m else 1,
                        )
                    else:
                        final = segment == owner
                        if final:
                            gather_partials(accumulators, shared, gemm.share_registers)
            if final:
                if cutlass.const_expr(gemm.row_bias_in_registers):
                    add_row_bias(accumulators, row_terms)
                elif cutlass.const_expr(gemm.adds_bias):
                    add_bias(accumulators, bias_coords, bias_buffer)
                ring_start = 0
                if cutlass.const_expr(gemm.cooperative):
                    ring_start = tiles_stored * epilogue.subtiles((tile_m, tile_n))
                tile = (None, None, tile_m_idx, tile_n_idx, batch)
                epilogue.store_tile(
                    accumulators,
                    store_atom,
                    gC_store[tile],
                    coords[tile],
                    (mC.shape[0], mC.shape[1]),
                    ring_start,
                    is_store_warp,
                )
                if cutlass.const_expr(not gemm.cooperative):
                    # the other warpgroup reuses the shared buffers: let them be read
                    epilogue.finish(is_store_warp)
                tiles_stored += 1
            if cutlass.const_expr(not gemm.cooperative):
                cute.arch.barrier_arrive(
                    barrier_id=EPILOGUE_ORDER_BARRIER + 1 - consumer,
                    number_of_threads=2 * wg,
                )
        else:
            read_state.advance(k_end - k_begin)
        position = next_position
        item_index += 1
    if cutlass.const_expr(gemm.dependent_launch):
        # the next kernel may launch (its own wait keeps it from our memory until we finish)
        cute.arch.griddepcontrol_launch_dependents()
    if cutlass.const_expr(gemm.cooperative):
        epilogue.finish(is_store_warp)
