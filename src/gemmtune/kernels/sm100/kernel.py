"""The Blackwell persistent warp-specialized GEMM: tcgen05 MMA into tensor memory.

One CTA = four epilogue warps (0-3: tensor memory -> registers -> global memory, through shared
memory and a TMA store or directly: `sm100/epilogue.py`), one MMA warp (4) and one TMA producer
warp (5). With 2-CTA
instructions (`two_cta`) a CTA pair computes one MMA tile: each CTA loads its share of A and B
(`rules.cta_share`), the pair's even CTA issues the MMAs, and each CTA's tensor memory holds its
own rows' accumulators. Two accumulator buffers (`rules.tmem_plan`) let the MMA warp fill one
tile's while the epilogue drains the last one's.

Work comes from our scheduler (`kernels/scheduler.py`), counted in MMA tiles (with 2-CTA
instructions its cluster is (cluster_m / 2) x cluster_n MMA tiles): data-parallel, split-K and
stream-K as on Hopper, each item a range of k-tiles of one tile; the items that share a tile sum
their partials through the workspace (`kernels/reduction.py`), each CTA of a pair its own rows.
Tensors are viewed as the Hopper kernel views them (`kernels/operands.py`).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.memory import SmemAllocator, TmemAllocator, get_num_tmem_alloc_cols

from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.kernels import scheduler as sched
from gemmtune.kernels.entries import GemmEntries
from gemmtune.kernels.operands import (
    DSL_DTYPES,
    accumulator_dtype,
    kernel_operands,
    operand_layouts,
)
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm100 import rules
from gemmtune.kernels.sm100.epilogue import drain


class BlackwellGemm(GemmEntries):
    """Builds and launches the kernel for one (`GemmConfig`, `KernelSignature`).

    The DSL's epilogue helpers (`cutlass.utils.gemm.sm100`) read the attributes named in
    `__init__`'s second block off this object."""

    def __init__(
        self, config: GemmConfig, signature: KernelSignature, *, dependent_launch: bool = True
    ):
        why = rules.implements(config)
        if why:
            raise ValueError(f"{config.key}: {why}")
        self.config = config
        self.signature = signature
        self.dependent_launch = dependent_launch
        self.cluster_shape_mn = (config.cluster_m, config.cluster_n)
        self.group = config.cta_group
        self.shares_tiles = config.decomposition is not Decomposition.DATA_PARALLEL
        # split-K reduces scattered (every split writes a share), stream-K through an owner
        self.scatters = config.decomposition is Decomposition.SPLIT_K
        self.mma_tiler_mn = (config.tile_m, config.tile_n)
        self.a_dtype = DSL_DTYPES[signature.ab_dtype]
        self.b_dtype = DSL_DTYPES[signature.b_input]
        self.applies_scales = bool(signature.scaling)
        self.per_row = signature.scaling == "row"
        self.a_major, self.b_major, self.c_layout = operand_layouts(signature)
        plan = rules.smem_plan(config, signature)
        self.ab_stages = plan.ab_stages
        self.ab_stage_bytes = plan.ab_stage_bytes
        self.tmem_columns = rules.tmem_plan(config).allocated_columns
        # read by the DSL's epilogues
        self.acc_dtype = accumulator_dtype(signature)
        self.c_dtype = DSL_DTYPES[signature.out_dtype]
        self.use_2cta_instrs = config.two_cta
        self.cta_tile_shape_mnk = (config.tile_m // self.group, config.tile_n, rules.TILE_K)
        self.epilog_sync_bar_id = rules.EPILOGUE_BARRIER
        self.epilogue_warp_id = rules.EPILOGUE_WARPS
        self.num_c_stage = plan.epi_stages
        self.iter_acc_early_release_in_epilogue = 0
        self.num_acc_stage = rules.ACCUMULATOR_BUFFERS

    def _tiled_mma(self) -> cute.TiledMma:
        group = tcgen05.CtaGroup.TWO if self.use_2cta_instrs else tcgen05.CtaGroup.ONE
        return sm100_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            self.a_major.mma_major_mode(),
            self.b_major.mma_major_mode(),
            self.acc_dtype,
            group,
            self.mma_tiler_mn,
        )

    def launch(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        c: cute.Tensor,
        scale_a: cute.Tensor | None,
        scale_b: cute.Tensor | None,
        workspace: cute.Tensor,
        counters: cute.Tensor,
        along_n: Int32,
        swizzle: Int32,
        splits: Int32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        """Traced by every entry (`GemmEntries`): build the TMA atoms, the schedule and the
        launch."""
        mA, mB, mC = kernel_operands(a, b, c, self.config.swap_ab)
        # the kernel's rows are b's columns in a swapped binary, and its columns a's rows
        row_scale, col_scale = (scale_b, scale_a) if self.config.swap_ab else (scale_a, scale_b)
        tiled_mma = self._tiled_mma()
        mma_tiler = (*self.mma_tiler_mn, rules.TILE_K)
        cluster_layout_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma.thr_id.shape,)
        )
        a_smem = sm100_utils.make_smem_layout_a(tiled_mma, mma_tiler, self.a_dtype, self.ab_stages)
        b_smem = sm100_utils.make_smem_layout_b(tiled_mma, mma_tiler, self.b_dtype, self.ab_stages)
        a_stage = cute.slice_(a_smem, (None, None, None, 0))
        b_stage = cute.slice_(b_smem, (None, None, None, 0))
        tma_atom_a, tma_a = cute.nvgpu.make_tiled_tma_atom_A(
            sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_shape_mn, tiled_mma.thr_id),
            mA,
            a_stage,
            mma_tiler,
            tiled_mma,
            cluster_layout_vmnk.shape,
        )
        tma_atom_b, tma_b = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_B(self.cluster_shape_mn, tiled_mma.thr_id),
            mB,
            b_stage,
            mma_tiler,
            tiled_mma,
            cluster_layout_vmnk.shape,
        )
        stage_bytes = cute.size_in_bytes(self.a_dtype, a_stage) + cute.size_in_bytes(
            self.b_dtype, b_stage
        )
        if cutlass.const_expr(stage_bytes != self.ab_stage_bytes):
            raise ValueError(
                f"{self.config.key}: a stage is {stage_bytes} bytes, rules.smem_plan says "
                f"{self.ab_stage_bytes}"
            )
        accumulators = tiled_mma.make_fragment_C(
            cute.append(tiled_mma.partition_shape_C(self.mma_tiler_mn), self.num_acc_stage)
        )
        tmem_columns = get_num_tmem_alloc_cols(accumulators)
        if cutlass.const_expr(tmem_columns != self.tmem_columns):
            raise ValueError(
                f"{self.config.key}: the accumulators take {tmem_columns} TMEM columns, "
                f"rules.tmem_plan says {self.tmem_columns}"
            )
        load_bytes = stage_bytes * self.group
        # Every epilogue moves a sub-tile at a time: a direct store of the whole tile at once
        # spilled (a 128x256 tile to an M-major bf16 output 464 local-memory operations, to
        # an N-major fp32 one 83), and so did a shared tile loaded beside its partials.
        epi_tile = (self.cta_tile_shape_mnk[0], rules.EPI_TILE_N)
        epi_smem = None
        tma_atom_c = None
        store_target = mC
        if cutlass.const_expr(self.config.tma_store):
            epi_smem = sm100_utils.make_smem_layout_epi(
                self.c_dtype, self.c_layout, epi_tile, self.num_c_stage
            )
            tma_atom_c, store_target = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(),
                mC,
                cute.select(epi_smem, mode=[0, 1]),
                epi_tile,
            )
        scheduler = sched.TileScheduler.for_tensors(
            self.config.decomposition.value,
            (self.cluster_shape_mn[0] // self.group, self.cluster_shape_mn[1]),
            mma_tiler,
            mA,
            mC,
            splits,
            max_active_clusters,
            along_n,
            swizzle,
        )
        self.kernel(
            tiled_mma,
            tma_atom_a,
            tma_a,
            tma_atom_b,
            tma_b,
            tma_atom_c,
            store_target,
            mC,
            row_scale,
            col_scale,
            workspace,
            counters,
            cluster_layout_vmnk,
            a_smem,
            b_smem,
            epi_smem,
            epi_tile,
            load_bytes,
            scheduler.clusters_m,
            scheduler.clusters_n,
            scheduler.work_units,
            scheduler.k_tiles,
            scheduler.grid_clusters,
            scheduler.splits,
            scheduler.dp_units,
            along_n,
            swizzle,
        ).launch(
            grid=(*self.cluster_shape_mn, scheduler.grid_clusters),
            block=[rules.THREADS, 1, 1],
            cluster=(*self.cluster_shape_mn, 1),
            min_blocks_per_mp=1,
            stream=stream,
            use_pdl=self.dependent_launch,
        )

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_atom_c,
        store_target: cute.Tensor,
        mC: cute.Tensor,
        row_scale: cute.Tensor | None,
        col_scale: cute.Tensor | None,
        workspace: cute.Tensor,
        counters: cute.Tensor,
        cluster_layout_vmnk: cute.Layout,
        a_smem: cute.ComposedLayout,
        b_smem: cute.ComposedLayout,
        epi_smem,
        epi_tile: cutlass.Constexpr,
        load_bytes: cutlass.Constexpr,
        clusters_m: Int32,
        clusters_n: Int32,
        work_units: Int32,
        k_tiles: Int32,
        grid_clusters: Int32,
        splits: Int32,
        dp_units: Int32,
        along_n: Int32,
        swizzle: Int32,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == rules.TMA_WARP:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            if cutlass.const_expr(self.config.tma_store):
                cpasync.prefetch_descriptor(tma_atom_c)
        peer = cute.arch.block_idx()[0] % self.group  # this CTA's place in its MMA's CTA group
        is_leader = peer == 0
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        coord_vmnk = cluster_layout_vmnk.get_flat_coord(cta_rank)
        # this CTA's MMA tile within the cluster, in MMA tiles
        mma_in_cluster = (coord_vmnk[1], coord_vmnk[2])

        @cute.struct
        class SharedStorage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            acc_barriers: cute.struct.MemRange[cutlass.Int64, self.num_acc_stage * 2]
            tmem_dealloc_barrier: cutlass.Int64
            tmem_holding_buffer: cutlass.Int32

        smem = SmemAllocator()
        storage = smem.allocate(SharedStorage)
        mcast_a = cute.size(cluster_layout_vmnk.shape[2])
        mcast_b = cute.size(cluster_layout_vmnk.shape[1])
        ab_producer, ab_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_barriers.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, mcast_a + mcast_b - 1),
            tx_count=load_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        ).make_participants()
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_barriers.data_ptr(),
            num_stages=self.num_acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, len(rules.EPILOGUE_WARPS) * self.group
            ),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = TmemAllocator(
            storage.tmem_holding_buffer.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(
                barrier_id=rules.TMEM_ALLOC_BARRIER,
                num_threads=32 * (1 + len(rules.EPILOGUE_WARPS)),
            ),
            allocator_warp_id=rules.EPILOGUE_WARPS[0],
            is_two_cta=self.use_2cta_instrs,
            two_cta_tmem_dealloc_mbar_ptr=storage.tmem_dealloc_barrier.ptr,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=cluster_layout_vmnk, is_relaxed=True)

        sA = smem.allocate_tensor(self.a_dtype, a_smem.outer, 128, swizzle=a_smem.inner)
        sB = smem.allocate_tensor(self.b_dtype, b_smem.outer, 128, swizzle=b_smem.inner)
        a_mask = None
        b_mask = None
        if cutlass.const_expr(mcast_a > 1 or mcast_b > 1 or self.use_2cta_instrs):
            a_mask = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, coord_vmnk, mcast_mode=2
            )
            b_mask = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, coord_vmnk, mcast_mode=1
            )

        mma_tiler = (*self.mma_tiler_mn, rules.TILE_K)
        gA = cute.local_tile(mA, cute.slice_(mma_tiler, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(mma_tiler, (0, None, None)), (None, None, None))
        tile_mn = cute.slice_(mma_tiler, (None, None, 0))
        thr_mma = tiled_mma.get_slice(peer)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        # the output in memory, its (m, n) coordinates, and its tiles as the TMA store
        # addresses them
        tCgC = thr_mma.partition_C(cute.local_tile(mC, tile_mn, (None, None, None)))
        cC = cute.local_tile(cute.make_identity_tensor(mC.shape), tile_mn, (None, None, None))
        tCcC = thr_mma.partition_C(cC)
        tCgC_tma = thr_mma.partition_C(cute.local_tile(store_target, tile_mn, (None, None, None)))
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a,
            coord_vmnk[2],
            cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape),
            cute.group_modes(sA, 0, 3),
            cute.group_modes(tCgA, 0, 3),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b,
            coord_vmnk[1],
            cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape),
            cute.group_modes(sB, 0, 3),
            cute.group_modes(tCgB, 0, 3),
        )
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler_mn)
        tCtAcc_layout = tiled_mma.make_fragment_C(cute.append(acc_shape, self.num_acc_stage)).layout

        scheduler = sched.TileScheduler(
            self.config.decomposition.value,
            (self.cluster_shape_mn[0] // self.group, self.cluster_shape_mn[1]),
            clusters_m,
            clusters_n,
            work_units,
            k_tiles,
            grid_clusters,
            splits,
            dp_units,
            along_n,
            swizzle,
        )
        cluster = sched.cluster_index()
        pipeline.pipeline_init_wait(cluster_shape_mn=cluster_layout_vmnk)

        if warp_idx == rules.TMA_WARP:
            if cutlass.const_expr(self.dependent_launch):
                cute.arch.griddepcontrol_wait()
            position = scheduler.first_position(cluster)
            while scheduler.valid(position, cluster):
                unit, k_begin, k_end, *_, next_position = scheduler.item(position, cluster)
                tile_m, tile_n, batch = scheduler.tile_of_unit(unit, mma_in_cluster)
                tAgA_tile = tAgA[(None, tile_m, None, batch)]
                tBgB_tile = tBgB[(None, tile_n, None, batch)]
                k_count = k_end - k_begin
                ab_producer.reset()
                empty = ab_producer.try_acquire()
                for _ in cutlass.range(0, k_count, 1, unroll=1):
                    handle = ab_producer.acquire_and_advance(empty)
                    cute.copy(
                        tma_atom_a,
                        tAgA_tile[(None, k_begin + handle.count)],
                        tAsA[(None, handle.index)],
                        tma_bar_ptr=handle.barrier,
                        mcast_mask=a_mask,
                    )
                    cute.copy(
                        tma_atom_b,
                        tBgB_tile[(None, k_begin + handle.count)],
                        tBsB[(None, handle.index)],
                        tma_bar_ptr=handle.barrier,
                        mcast_mask=b_mask,
                    )
                    empty = cutlass.Boolean(True)
                    if handle.count + 1 < k_count:
                        empty = ab_producer.try_acquire()
                position = next_position
            ab_producer.tail()

        if warp_idx == rules.MMA_WARP:
            tmem.wait_for_alloc()
            accumulators = cute.make_tensor(tmem.retrieve_ptr(self.acc_dtype), tCtAcc_layout)
            acc_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Producer, self.num_acc_stage
            )
            position = scheduler.first_position(cluster)
            while scheduler.valid(position, cluster):
                _, k_begin, k_end, *_, next_position = scheduler.item(position, cluster)
                k_count = k_end - k_begin
                tile_acc = accumulators[(None, None, None, acc_state.index)]
                ab_consumer.reset()
                full = cutlass.Boolean(True)
                if is_leader:
                    full = ab_consumer.try_wait()
                    acc_pipeline.producer_acquire(acc_state)
                tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                for _ in range(k_count):
                    if is_leader:
                        handle = ab_consumer.wait_and_advance(full)
                        for k_block in cutlass.range(cute.size(tCrA, mode=[2]), unroll_full=True):
                            block = (None, None, k_block, handle.index)
                            cute.gemm(tiled_mma, tile_acc, tCrA[block], tCrB[block], tile_acc)
                            tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                        handle.release()
                        full = cutlass.Boolean(True)
                        if handle.count + 1 < k_count:
                            full = ab_consumer.try_wait()
                if is_leader:
                    acc_pipeline.producer_commit(acc_state)
                acc_state.advance()
                position = next_position
            acc_pipeline.producer_tail(acc_state)

        sC = None
        if cutlass.const_expr(self.config.tma_store):
            sC = smem.allocate_tensor(self.c_dtype, epi_smem.outer, 128, swizzle=epi_smem.inner)
        if warp_idx < rules.MMA_WARP:
            tmem.allocate(self.tmem_columns)
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
            accumulators = cute.make_tensor(tmem_ptr, tCtAcc_layout)
            drain(
                self,
                tidx,
                warp_idx,
                accumulators,
                tCgC,
                tCcC,
                tCgC_tma,
                sC,
                tma_atom_c,
                mC,
                row_scale,
                col_scale,
                workspace,
                counters,
                epi_tile,
                acc_pipeline,
                scheduler,
                cluster,
                mma_in_cluster,
                cta_rank,
            )
            tmem.relinquish_alloc_permit()
            tmem.free(tmem_ptr)
