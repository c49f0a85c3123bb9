"""The Hopper persistent warp-specialized GEMM: mainloop + epilogue + tile scheduler.

One CTA = one producer warpgroup (warp 0 issues the TMA loads; its registers go to the
consumers) and two consumer warpgroups issuing WGMMA (three for 192-row tiles).
- cooperative: all consumer warpgroups work on one tile, each on its share of the rows;
- ping-pong: they take alternate tiles. Named barriers order their mainloops (so their
  WGMMAs do not compete and each finds its stages in the expected phase) and their
  epilogues (they share the epilogue's shared memory), so one's epilogue overlaps the
  other's mainloop.
The producer warp's loop is `mainloop.produce`, the consumer warpgroups' `consumer.consume`.

Tensors arrive in torch's order and are viewed as the kernel's (M, K, L) / (N, K, L) / (M, N, L)
at trace time (`kernels/operands.py`), so a launch passes torch tensors untouched. A scaled (fp8)
signature's binary is compiled from `scaled` (`kernels/entries.py`), which takes the scales
after a, b and out; one with a bias from `biased` or `scaled_biased`, which take it after those
(`kernels/bias.py`).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from gemmtune.core.config import Decomposition, GemmConfig, Schedule
from gemmtune.kernels import scheduler as sched
from gemmtune.kernels.entries import GemmEntries
from gemmtune.kernels.operands import (
    DSL_DTYPES,
    accumulator_dtype,
    kernel_operands,
    operand_layouts,
)
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import consumer, mainloop, rules


def stage_layout(staged: cute.ComposedLayout) -> cute.ComposedLayout:
    """One stage of a swizzled (rows, columns, stages) shared-memory layout. Taken apart by
    hand, not by `cute.slice_`: the DSL aborts slicing a 16-bit stage whose element count is
    not a multiple of the 128-byte swizzle's 1,024 (a K-major B tile of 88 or 104 rows over
    64 elements; an M-major output sub-tile of 64 x 8), although such a stage is a whole
    number of the swizzle's 1,024-byte periods, which is all TMA and WGMMA need of it."""
    return cute.make_composed_layout(staged.inner, 0, cute.select(staged.outer, mode=[0, 1]))


class HopperGemm(GemmEntries):
    """Builds and launches the kernel for one (`GemmConfig`, `KernelSignature`).

    `consumer.consume` reads the compile-time plan that `__init__` sets off this object."""

    def __init__(
        self, config: GemmConfig, signature: KernelSignature, *, dependent_launch: bool = True
    ):
        why = rules.implements(config)
        if why:
            raise ValueError(f"{config.key}: {why}")
        self.config = config
        self.signature = signature
        self.dependent_launch = dependent_launch
        # torch's b (a swapped kernel's A) where no kernel before ours writes it: its first
        # stages load while that kernel finishes (`mainloop.produce`)
        self.early_operand = None
        if signature.constant_b and dependent_launch:
            self.early_operand = "a" if config.swap_ab else "b"
        self.cooperative = config.schedule is Schedule.COOPERATIVE
        self.tile_shape_mnk = (
            config.tile_m,
            config.tile_n,
            rules.tile_k(signature.ab_bytes, config.stage_k_bytes),
        )
        self.cluster_shape_mn = (config.cluster_m, config.cluster_n)
        plan = rules.smem_plan(config, signature)
        self.ab_stages, self.epi_stages = plan.ab_stages, plan.epi_stages
        self.epi_group = plan.epi_group
        self.epi_tile = rules.epi_tile(config)
        self.a_dtype = DSL_DTYPES[signature.ab_dtype]
        self.b_dtype = DSL_DTYPES[signature.b_input]
        self.applies_scales = bool(signature.scaling)
        self.per_row = signature.scaling == "row"
        self.adds_bias = signature.bias
        # the bias runs along the output's columns: a swapped binary's rows
        self.bias_along_m = config.swap_ab
        self.row_bias_in_registers = rules.row_bias_in_registers(config, signature)
        self.promoted = signature.promoted
        self.out_dtype = DSL_DTYPES[signature.out_dtype]
        self.acc_dtype = accumulator_dtype(signature)
        self.a_layout, self.b_layout, self.c_layout = operand_layouts(signature)
        wg = rules.THREADS_PER_WARPGROUP
        self.consumers = rules.consumer_warpgroups(config)
        register_tiles = rules.promoted_register_tiles(config) if signature.promoted else 1
        self.producer_registers, self.consumer_registers = rules.register_split(
            config, register_tiles
        )
        # what a reduction may load at once (`reduction.share_step`, `gather_chunk`): a
        # promoted fp8 tile's tiles of partial sums take the room
        spare = self.consumer_registers - rules.accumulator_registers(config)
        spare -= rules.CONSUMER_OVERHEAD_REGISTERS
        self.share_registers = 0 if signature.promoted else spare
        self.threads = (1 + self.consumers) * wg
        # threads that compute one tile, and warps that free each A/B stage
        self.tile_threads = self.consumers * wg if self.cooperative else wg
        self.mcast_a = config.cluster_n  # an A tile is shared along the cluster's N
        self.mcast_b = config.cluster_m
        self.shares_tiles = config.decomposition is not Decomposition.DATA_PARALLEL
        # split-K reduces scattered (every split writes a share), stream-K through an owner
        self.scatters = config.decomposition is Decomposition.SPLIT_K

    def _tiled_mma(self) -> cute.TiledMma:
        atoms = (self.consumers, 1, 1) if self.cooperative else (1, 1, 1)
        return sm90_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            self.a_layout.sm90_mma_major_mode(),
            self.b_layout.sm90_mma_major_mode(),
            self.acc_dtype,
            atoms,
            tiler_mn=(64, self.config.tile_n),
        )

    @cute.jit
    def biased(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        c: cute.Tensor,
        bias: cute.Tensor,
        workspace: cute.Tensor,
        counters: cute.Tensor,
        along_n: Int32,
        swizzle: Int32,
        splits: Int32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        """The entry of a signature with a bias: `bias` is 1-D, one element per column of `c`,
        in its type."""
        self.launch(
            a, b, c, None, None, workspace, counters, along_n, swizzle, splits,
            max_active_clusters, stream, bias,
        )  # fmt: skip

    @cute.jit
    def scaled_biased(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        c: cute.Tensor,
        scale_a: cute.Tensor,
        scale_b: cute.Tensor,
        bias: cute.Tensor,
        workspace: cute.Tensor,
        counters: cute.Tensor,
        along_n: Int32,
        swizzle: Int32,
        splits: Int32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        """The entry of a scaled (fp8) signature with a bias: the scales, then the bias."""
        self.launch(
            a, b, c, scale_a, scale_b, workspace, counters, along_n, swizzle, splits,
            max_active_clusters, stream, bias,
        )  # fmt: skip

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
        bias: cute.Tensor | None = None,
    ):
        """Traced by every entry: build the TMA atoms, the schedule and the launch."""
        mA, mB, mC = kernel_operands(a, b, c, self.config.swap_ab)
        # the kernel's rows are b's columns in a swapped binary, and its columns a's rows
        row_scale, col_scale = (scale_b, scale_a) if self.config.swap_ab else (scale_a, scale_b)
        tiled_mma = self._tiled_mma()
        tile_m, tile_n, tile_k = self.tile_shape_mnk
        a_smem = sm90_utils.make_smem_layout_a(
            self.a_layout, self.tile_shape_mnk, self.a_dtype, self.ab_stages
        )
        b_smem = sm90_utils.make_smem_layout_b(
            self.b_layout, self.tile_shape_mnk, self.b_dtype, self.ab_stages
        )
        a_op = cpasync.CopyBulkTensorTileG2SOp()
        if cutlass.const_expr(self.mcast_a > 1):
            a_op = cpasync.CopyBulkTensorTileG2SMulticastOp()
        b_op = cpasync.CopyBulkTensorTileG2SOp()
        if cutlass.const_expr(self.mcast_b > 1):
            b_op = cpasync.CopyBulkTensorTileG2SMulticastOp()
        tma_atom_a, tma_a = cpasync.make_tiled_tma_atom(
            a_op,
            mA,
            stage_layout(a_smem),
            (tile_m, tile_k),
            num_multicast=self.mcast_a,
        )
        tma_atom_b, tma_b = cpasync.make_tiled_tma_atom(
            b_op,
            mB,
            stage_layout(b_smem),
            (tile_n, tile_k),
            num_multicast=self.mcast_b,
        )
        epi_smem = sm90_utils.make_smem_layout_epi(
            self.out_dtype, self.c_layout, self.epi_tile, max(self.epi_stages, 1)
        )
        store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.out_dtype)
        store_target = mC
        if cutlass.const_expr(self.config.tma_store):
            store_atom, store_target = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(),
                mC,
                stage_layout(epi_smem),
                self.epi_tile,
            )

        scheduler = sched.TileScheduler.for_tensors(
            self.config.decomposition.value,
            self.cluster_shape_mn,
            self.tile_shape_mnk,
            mA,
            mC,
            splits,
            max_active_clusters,
            along_n,
            swizzle,
        )
        grid = (*self.cluster_shape_mn, scheduler.grid_clusters)
        self.kernel(
            tma_atom_a,
            tma_a,
            tma_atom_b,
            tma_b,
            store_atom,
            store_target,
            mC,
            row_scale,
            col_scale,
            bias,
            workspace,
            counters,
            tiled_mma,
            a_smem,
            b_smem,
            epi_smem,
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
            grid=grid,
            block=[self.threads, 1, 1],
            cluster=(*self.cluster_shape_mn, 1),
            min_blocks_per_mp=1,
            stream=stream,
            use_pdl=self.dependent_launch,
        )

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,
        store_atom: cute.CopyAtom,
        store_target: cute.Tensor,
        mC: cute.Tensor,
        row_scale: cute.Tensor | None,
        col_scale: cute.Tensor | None,
        bias: cute.Tensor | None,
        workspace: cute.Tensor,
        counters: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_smem: cute.ComposedLayout,
        b_smem: cute.ComposedLayout,
        epi_smem: cute.ComposedLayout,
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
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warp_group = cute.arch.make_warp_uniform(tidx // rules.THREADS_PER_WARPGROUP)
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            if cutlass.const_expr(self.config.tma_store):
                cpasync.prefetch_descriptor(store_atom)

        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_layout = cute.make_layout((*self.cluster_shape_mn, 1))
        cta_coord = cluster_layout.get_flat_coord(cta_rank)
        cta_in_cluster = (cta_coord[0], cta_coord[1])

        # --- shared memory and the A/B pipeline ------------------------------------------
        smem = SmemAllocator()
        sA = smem.allocate_tensor(self.a_dtype, a_smem.outer, 1024, swizzle=a_smem.inner)
        sB = smem.allocate_tensor(self.b_dtype, b_smem.outer, 1024, swizzle=b_smem.inner)
        a_stage_bytes = cute.size(stage_layout(a_smem).outer) * self.a_dtype.width // 8
        b_stage_bytes = cute.size(stage_layout(b_smem).outer) * self.b_dtype.width // 8
        mcast_size = self.mcast_a + self.mcast_b - 1
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, mcast_size * self.tile_threads // 32
            ),
            tx_count=a_stage_bytes + b_stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cluster_layout.shape)),
            defer_sync=True,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        # --- partitions ---------------------------------------------------------------------
        tile_m, tile_n, tile_k = self.tile_shape_mnk
        gA = cute.local_tile(mA, (tile_m, tile_k), (None, None, None))  # (bM,bK,RM,RK,L)
        gB = cute.local_tile(mB, (tile_n, tile_k), (None, None, None))  # (bN,bK,RN,RK,L)
        a_cta_layout = cute.make_layout(cute.slice_(cluster_layout, (0, None, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a,
            cta_coord[1],
            a_cta_layout,
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2),
        )
        b_cta_layout = cute.make_layout(cute.slice_(cluster_layout, (None, 0, 0)).shape)
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b,
            cta_coord[0],
            b_cta_layout,
            cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2),
        )
        a_mcast_mask = 0
        if cutlass.const_expr(self.mcast_a > 1):
            a_mcast_mask = cute.make_layout_image_mask(cluster_layout, cta_coord, mode=1)
        b_mcast_mask = 0
        if cutlass.const_expr(self.mcast_b > 1):
            b_mcast_mask = cute.make_layout_image_mask(cluster_layout, cta_coord, mode=0)

        scheduler = sched.TileScheduler(
            self.config.decomposition.value,
            self.cluster_shape_mn,
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

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        # With programmatic dependent launch everything above overlaps the tail of the kernel
        # before ours in the stream, and every warp that touches global memory waits until
        # that kernel has finished and its writes are visible: the consumers here, the
        # producer in `mainloop.produce` (after its early loads of a constant b).
        if warp_group == 0:
            cute.arch.setmaxregister_decrease(self.producer_registers)
            if warp_idx == 0:
                mainloop.produce(
                    ab_pipeline,
                    scheduler,
                    cta_in_cluster,
                    tma_atom_a,
                    tAgA,
                    tAsA,
                    a_mcast_mask,
                    tma_atom_b,
                    tBgB,
                    tBsB,
                    b_mcast_mask,
                    self.mcast_a,
                    self.mcast_b,
                    self.ab_stages,
                    self.dependent_launch,
                    self.early_operand,
                )
        else:
            cute.arch.setmaxregister_increase(self.consumer_registers)
            if cutlass.const_expr(self.dependent_launch):
                cute.arch.griddepcontrol_wait()
            consumer.consume(
                self,
                ab_pipeline,
                scheduler,
                cta_in_cluster,
                tiled_mma,
                sA,
                sB,
                smem,
                epi_smem,
                store_atom,
                store_target,
                mC,
                row_scale,
                col_scale,
                bias,
                workspace,
                counters,
                tidx,
                warp_idx,
                warp_group - 1,
            )
