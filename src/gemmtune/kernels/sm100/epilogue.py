"""Blackwell epilogue: accumulators (fp32, in tensor memory) to the output, a sub-tile at a time.

The four epilogue warps read their lanes of tensor memory (`tcgen05.ld`, the DSL's load atom
for the tile) into registers one `EPI_TILE_N`-column sub-tile at a time, then
- with `tma_store`: registers -> shared memory (a ring of `stages` buffers whose position
  carries over from tile to tile) -> TMA bulk store, issued by warp 0;
- without: registers -> global memory, vectorised where the whole tile lies inside the output,
  element by element and predicated on its bounds where it does not (a vector that crossed the
  edge would write into whatever follows a row of a padded output).
A tile that several items compute (split-K, stream-K: `kernels/reduction.py`) goes through the
same sub-tile loop: a publishing item writes its partial sums to the workspace instead of the
output (`publish`), the stream-K owner adds the others' partials to each sub-tile before storing
it (`store_tile` with `gather`), and split-K's segments sum their shares from the workspace
(`reduction.reduce_share` over `positions`, which numbers a thread's values as `publish` and
`store_tile` visit them: sub-tile by sub-tile). An fp8 product's scales are applied to each
sub-tile as it is loaded (`_scale`). `drain` is the epilogue warps' loop over their CTA's items.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.utils.gemm.sm100 import (
    epilogue_smem_copy_and_partition,
    epilogue_tmem_copy_and_partition,
    transform_partitioned_tensor_layout,
)

from gemmtune.kernels import scheduler as sched
from gemmtune.kernels.reduction import (
    SharedTile,
    add_partials,
    await_partials,
    reduce_share,
    signal_arrival,
    store_partial,
)
from gemmtune.kernels.scaling import tensor_scale_factor
from gemmtune.kernels.sm100 import rules


@dataclass(frozen=True)
class TmemEpilogue:
    """What one epilogue thread needs to move its accumulators, built once per kernel. Frozen,
    so that the DSL's loops read it rather than carry it."""

    tiled_copy_t2r: cute.TiledCopy
    tTR_tAcc: cute.Tensor  # (T2R, T2R_M, T2R_N, SUB, BUFFER): this thread's accumulators
    tTR_gC: cute.Tensor  # (T2R, T2R_M, T2R_N, SUB, RestM, RestN, RestL): the output
    tTR_cC: cute.Tensor  # the same, of the output's (m, n) coordinates
    vector_store: cute.CopyAtom  # registers -> global, as wide as the output's layout allows
    tiled_copy_r2s: object  # TMA store only: registers -> shared memory
    tRS_sC: object  # (R2S, R2S_M, R2S_N, STAGE)
    bSG_sC: object  # (TMA, STAGE)
    bSG_gC: object  # (TMA, SUB, RestM, RestN, RestL)
    values_shape: tuple  # one sub-tile of this thread's accumulators: (T2R, T2R_M, T2R_N)
    acc_dtype: type  # fp32, or int32 for int8 inputs
    subtiles: int
    stages: int
    c_dtype: type
    barrier: pipeline.NamedBarrier

    @staticmethod
    def create(
        kernel,
        thread: Int32,
        accumulators: cute.Tensor,
        tCgC: cute.Tensor,
        tCcC: cute.Tensor,
        epi_tile: tuple,
        barrier: pipeline.NamedBarrier,
        tma_atom_c: cute.CopyAtom | None = None,
        tCgC_tma: cute.Tensor | None = None,
        sC: cute.Tensor | None = None,
    ) -> "TmemEpilogue":
        """`accumulators`: the MMA's partition of tensor memory, ((atom), MMA_M, MMA_N, BUFFER);
        `tCgC` / `tCcC`: its partition of the output and of the output's coordinates, with the
        tile grid's modes after; with a TMA store, `tCgC_tma` (the same of the TMA's
        coordinate tensor) and `sC` (the ring). `kernel` carries the DSL's epilogue
        attributes (`cta_tile_shape_mnk`, `c_layout`, `c_dtype`, `acc_dtype`)."""
        tCtAcc = transform_partitioned_tensor_layout(accumulators)
        gC = transform_partitioned_tensor_layout(tCgC)
        tiled_copy_t2r, tTR_tAcc, tTR_rAcc = epilogue_tmem_copy_and_partition(
            kernel, thread, tCtAcc, gC, epi_tile, kernel.use_2cta_instrs
        )
        thr_copy = tiled_copy_t2r.get_slice(thread)
        tTR_gC = thr_copy.partition_D(cute.flat_divide(gC, epi_tile))
        tTR_cC = thr_copy.partition_D(
            cute.flat_divide(transform_partitioned_tensor_layout(tCcC), epi_tile)
        )
        # (T2R, T2R_M, T2R_N, EPI_M, EPI_N, ...) -> (T2R, T2R_M, T2R_N, SUB, ...)
        tTR_tAcc = cute.group_modes(tTR_tAcc, 3, 5)
        tTR_gC = cute.group_modes(tTR_gC, 3, 5)
        tTR_cC = cute.group_modes(tTR_cC, 3, 5)
        values_shape = tTR_rAcc.shape
        one_subtile = tTR_gC[(None, None, None, 0, 0, 0, 0)]
        common = cute.max_common_layout(
            cute.make_rmem_tensor(values_shape, kernel.c_dtype).layout, one_subtile.layout
        )
        bits = min(tTR_gC.iterator.alignment * 8, cute.size(common) * kernel.c_dtype.width, 256)
        vector_store = cute.make_copy_atom(
            cute.nvgpu.CopyR2GOp(), kernel.c_dtype, num_bits_per_copy=bits
        )
        tiled_copy_r2s = tRS_sC = bSG_sC = bSG_gC = None
        stages = 0
        if cutlass.const_expr(tma_atom_c is not None):
            tiled_copy_r2s, _, tRS_sC = epilogue_smem_copy_and_partition(
                kernel,
                tiled_copy_t2r,
                cute.make_rmem_tensor(values_shape, kernel.c_dtype),
                thread,
                sC,
            )
            gC_tma = cute.flat_divide(transform_partitioned_tensor_layout(tCgC_tma), epi_tile)
            bSG_sC, bSG_gC = cpasync.tma_partition(
                tma_atom_c,
                0,
                cute.make_layout(1),
                cute.group_modes(sC, 0, 2),
                cute.group_modes(gC_tma, 0, 2),
            )
            bSG_gC = cute.group_modes(bSG_gC, 1, 3)
            stages = kernel.num_c_stage
        return TmemEpilogue(
            tiled_copy_t2r=tiled_copy_t2r,
            tTR_tAcc=tTR_tAcc,
            tTR_gC=tTR_gC,
            tTR_cC=tTR_cC,
            vector_store=vector_store,
            tiled_copy_r2s=tiled_copy_r2s,
            tRS_sC=tRS_sC,
            bSG_sC=bSG_sC,
            bSG_gC=bSG_gC,
            values_shape=values_shape,
            acc_dtype=kernel.acc_dtype,
            subtiles=cute.size(tTR_tAcc, mode=[3]),
            stages=stages,
            c_dtype=kernel.c_dtype,
            barrier=barrier,
        )

    @property
    def values(self) -> int:
        """Accumulators per thread and sub-tile."""
        return cute.size(self.values_shape)

    @property
    def tile_values(self) -> int:
        """Accumulators per thread and tile: the length of its partial sums."""
        return self.values * self.subtiles

    def positions(self, tensor: cute.Tensor, tile_coord: tuple) -> cute.Tensor:
        """This thread's part of `tensor` (`tTR_gC` or `tTR_cC`) in one tile, indexed by the
        position of each value in the thread's partial sums."""
        return tensor[(None, None, None, None, *tile_coord)]

    @cute.jit
    def _load(self, values: cute.Tensor, subtile: int, buffer: Int32):
        cute.copy(self.tiled_copy_t2r, self.tTR_tAcc[(None, None, None, subtile, buffer)], values)

    @cute.jit
    def _release(self, acc_pipeline: pipeline.PipelineAsync, acc_state: pipeline.PipelineState):
        """Hand the accumulator buffer back to the MMA warp: this warp's loads are done."""
        cute.arch.fence_view_async_tmem_load()
        with cute.arch.elect_one():
            acc_pipeline.consumer_release(acc_state)

    @cute.jit
    def _scale(
        self, values: cute.Tensor, subtile: int, tile_coord: tuple, extent_mn: tuple, scales
    ):
        """Multiply one sub-tile's accumulators by an fp8 product's scales. `scales`: None
        (no scaling), the per-tensor factor (`scaling.tensor_scale_factor`), or the row and
        column scales in the kernel's output coordinates, read per value (0 past the edges,
        whose values are never stored)."""
        if cutlass.const_expr(isinstance(scales, tuple)):
            row_scale, col_scale = scales
            coords = self.tTR_cC[(None, None, None, subtile, *tile_coord)]
            for i in cutlass.range_constexpr(cute.size(values)):
                coord = coords[i]
                factor = cutlass.Float32(0.0)
                if coord[0] < extent_mn[0] and coord[1] < extent_mn[1]:
                    factor = row_scale[coord[0]] * col_scale[coord[1]]
                values[i] = values[i] * factor
        elif cutlass.const_expr(scales is not None):
            values.store(values.load() * scales)

    @cute.jit
    def publish(
        self,
        acc_pipeline: pipeline.PipelineAsync,
        acc_state: pipeline.PipelineState,
        shared: SharedTile,
        slot: Int32,
        tile_coord: tuple,
        extent_mn: tuple,
        scales=None,
    ):
        """Write the tile's partial sums (the accumulator buffer of `acc_state`, waited for,
        scaled by `scales`: `_scale`) to `slot`, give the buffer back, and count this item in at
        the tile's counter."""
        values = cute.make_rmem_tensor(self.values_shape, self.acc_dtype)
        for subtile in cutlass.range_constexpr(self.subtiles):
            self._load(values, subtile, acc_state.index)
            self._scale(values, subtile, tile_coord, extent_mn, scales)
            store_partial(values, shared, slot, subtile * self.values, self.tile_values)
        self._release(acc_pipeline, acc_state)
        signal_arrival(shared)

    @cute.jit
    def store_tile(
        self,
        acc_pipeline: pipeline.PipelineAsync,
        acc_state: pipeline.PipelineState,
        tile_coord: tuple,
        inside: cutlass.Boolean,
        extent_mn: tuple,
        gather: cutlass.Boolean,
        shared: SharedTile | None,
        ring_start: Int32,
        tma_atom_c: cute.CopyAtom | None,
        c_pipeline: pipeline.PipelineTmaStore | None,
        is_store_warp: cutlass.Boolean,
        scales=None,
    ):
        """Store the tile in the accumulator buffer of `acc_state` (waited for, scaled by
        `scales`: `_scale`), giving the buffer back after its last load. `inside`: the whole
        tile lies within the output (the direct store need not check bounds). `gather`: add
        the other segments' partials (`reduction.await_partials` done). `ring_start`: sub-tiles
        this thread's group stored before (TMA store)."""
        values = cute.make_rmem_tensor(self.values_shape, self.acc_dtype)
        out = cute.make_rmem_tensor(self.values_shape, self.c_dtype)
        for subtile in cutlass.range_constexpr(self.subtiles):
            self._load(values, subtile, acc_state.index)
            if cutlass.const_expr(subtile == self.subtiles - 1):
                self._release(acc_pipeline, acc_state)
            self._scale(values, subtile, tile_coord, extent_mn, scales)
            if cutlass.const_expr(shared is not None):
                if gather:
                    add_partials(values, shared, subtile * self.values, self.tile_values)
            if cutlass.const_expr(tma_atom_c is not None):
                staged = self.tiled_copy_r2s.retile(out)
                staged.store(self.tiled_copy_r2s.retile(values).load().to(self.c_dtype))
                buffer = (ring_start + subtile) % self.stages
                cute.copy(self.tiled_copy_r2s, staged, self.tRS_sC[(None, None, None, buffer)])
                # make the generic-proxy shared writes visible to the TMA (async proxy)
                cute.arch.fence_proxy("async.shared", space="cta")
                self.barrier.arrive_and_wait()
                if is_store_warp:
                    cute.copy(
                        tma_atom_c,
                        self.bSG_sC[(None, buffer)],
                        self.bSG_gC[(None, subtile, *tile_coord)],
                    )
                    c_pipeline.producer_commit()
                    c_pipeline.producer_acquire()
                self.barrier.arrive_and_wait()
            else:
                out.store(values.load().to(self.c_dtype))
                destination = self.tTR_gC[(None, None, None, subtile, *tile_coord)]
                if inside:
                    cute.copy(self.vector_store, out, destination)
                else:
                    coords = self.tTR_cC[(None, None, None, subtile, *tile_coord)]
                    for i in cutlass.range_constexpr(cute.size(out)):
                        coord = coords[i]
                        if coord[0] < extent_mn[0] and coord[1] < extent_mn[1]:
                            destination[i] = out[i]


@cute.jit
def drain(
    gemm,
    tidx: Int32,
    warp_idx: Int32,
    accumulators: cute.Tensor,
    tCgC: cute.Tensor,
    tCcC: cute.Tensor,
    tCgC_tma: cute.Tensor,
    sC,
    tma_atom_c,
    mC: cute.Tensor,
    row_scale: cute.Tensor | None,
    col_scale: cute.Tensor | None,
    workspace: cute.Tensor,
    counters: cute.Tensor,
    epi_tile: cutlass.Constexpr,
    acc_pipeline: pipeline.PipelineAsync,
    scheduler: sched.TileScheduler,
    cluster: Int32,
    mma_in_cluster: tuple,
    cta_rank: Int32,
):
    """The epilogue warps (0-3) of `gemm`, a `BlackwellGemm`: every item's accumulators to the
    output, or to the workspace where the item shares its tile and does not write it; an fp8
    product's scaled first (before a partial is published: scaling is linear, so the reduction
    adds scaled partials)."""
    threads = 32 * len(rules.EPILOGUE_WARPS)
    barrier = pipeline.NamedBarrier(barrier_id=rules.EPILOGUE_BARRIER, num_threads=threads)
    epi = TmemEpilogue.create(
        gemm, tidx, accumulators, tCgC, tCcC, epi_tile, barrier, tma_atom_c, tCgC_tma, sC
    )
    acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, gemm.num_acc_stage)
    c_pipeline = None
    if cutlass.const_expr(gemm.config.tma_store):
        c_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=gemm.num_c_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads),
        )
    extent_mn = (mC.shape[0], mC.shape[1])
    scales = None
    if cutlass.const_expr(gemm.applies_scales):
        if cutlass.const_expr(gemm.dependent_launch):
            # the kernel before ours may write the scales (a quantization's)
            cute.arch.griddepcontrol_wait()
        scales = (row_scale, col_scale)
        if cutlass.const_expr(not gemm.per_row):
            scales = tensor_scale_factor(row_scale, col_scale)
    tile_m, tile_n = gemm.mma_tiler_mn
    ctas = gemm.cluster_shape_mn[0] * gemm.cluster_shape_mn[1]
    is_store_warp = warp_idx == rules.EPILOGUE_WARPS[0]
    tiles_stored = Int32(0)
    position = scheduler.first_position(cluster)
    while scheduler.valid(position, cluster):
        (
            unit,
            _,
            _,
            segment,
            segments,
            partial_slot,
            first_slot,
            counter,
            owner,
            next_position,
        ) = scheduler.item(position, cluster)
        tile_coord = scheduler.tile_of_unit(unit, mma_in_cluster)
        inside = cutlass.Boolean(False)
        if (tile_coord[0] + 1) * tile_m <= extent_mn[0]:
            inside = (tile_coord[1] + 1) * tile_n <= extent_mn[1]
        acc_pipeline.consumer_wait(acc_state)
        writes = cutlass.Boolean(True)
        gather = cutlass.Boolean(False)
        shared = None
        if cutlass.const_expr(gemm.shares_tiles):
            # slots and counters are per CTA of the cluster
            shared = SharedTile(
                workspace,
                counters,
                first_slot * ctas + cta_rank,
                ctas,
                counter * ctas + cta_rank,
                segment,
                segments,
                tidx,
                threads,
                barrier,
                gemm.acc_dtype,
            )
            publishes = segments > 1
            if cutlass.const_expr(not gemm.scatters):
                if segment == owner:
                    publishes = cutlass.Boolean(False)
            if publishes:
                writes = cutlass.Boolean(False)
                epi.publish(
                    acc_pipeline, acc_state, shared, partial_slot * ctas + cta_rank,
                    tile_coord, extent_mn, scales,
                )  # fmt: skip
                if cutlass.const_expr(gemm.scatters):
                    reduce_share(
                        epi.tile_values,
                        shared,
                        epi.positions(epi.tTR_gC, tile_coord),
                        epi.positions(epi.tTR_cC, tile_coord),
                        extent_mn,
                        gemm.c_dtype,
                        0,  # the wider steps are measured on Hopper's kernel only
                    )
            else:
                gather = segments > 1
                if gather:
                    await_partials(shared)
        if writes:
            epi.store_tile(
                acc_pipeline, acc_state, tile_coord, inside, extent_mn, gather, shared,
                tiles_stored * epi.subtiles, tma_atom_c, c_pipeline, is_store_warp, scales,
            )  # fmt: skip
            tiles_stored += 1
        acc_state.advance()
        position = next_position
    if cutlass.const_expr(gemm.config.tma_store):
        c_pipeline.producer_tail()
    else:
        pipeline.NamedBarrier(
            barrier_id=rules.TMEM_DEALLOC_BARRIER, num_threads=threads
        ).arrive_and_wait()
