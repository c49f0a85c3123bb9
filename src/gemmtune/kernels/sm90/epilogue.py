"""Hopper epilogues: accumulators (fp32, in registers) to the output tensor.

Two variants, chosen by `GemmConfig.tma_store`:
- `TmaStoreEpilogue`: sub-tile by sub-tile, registers -> shared memory (stmatrix for 16-bit
  outputs) -> TMA bulk store. TMA clips at the tensor's edges. The shared buffers form a ring
  whose position carries over from tile to tile, so stores of one tile drain while the next
  tile's mainloop runs.
- `store_direct`: each thread writes its accumulators straight to global memory, predicated
  on the output's bounds. No shared memory, so the mainloop gets more stages.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32


@dataclass(frozen=True)
class TmaStoreEpilogue:
    """What the TMA-store epilogue of one consumer thread needs, built once per kernel.

    Frozen, so that the DSL's loops read it rather than carry it."""

    tiled_copy_r2s: cute.TiledCopy
    tRS_sC: cute.Tensor  # (R2S, R2S_M, R2S_N, PIPE): this thread's share of each buffer
    sub_shape: tuple  # (R2S, R2S_M, R2S_N) of one sub-tile
    sC: cute.Tensor
    epi_tile: tuple
    epi_stages: int
    epi_group: int
    out_dtype: type
    barrier: pipeline.NamedBarrier

    @staticmethod
    def create(
        tiled_mma: cute.TiledMma,
        copy_atom_r2s: cute.CopyAtom,
        stmatrix_atom: cute.CopyAtom,
        sC: cute.Tensor,
        epi_tile: tuple,
        epi_stages: int,
        epi_group: int,
        thread_in_group: Int32,
        group_threads: int,
        barrier_id: int,
        out_dtype: type,
    ) -> "TmaStoreEpilogue":
        layout_donor = cute.make_tiled_copy_C_atom(stmatrix_atom, tiled_mma)
        tiled_copy_r2s = cute.make_tiled_copy_S(copy_atom_r2s, layout_donor)
        thr_copy = tiled_copy_r2s.get_slice(thread_in_group)
        return TmaStoreEpilogue(
            tiled_copy_r2s=tiled_copy_r2s,
            tRS_sC=thr_copy.partition_D(sC),
            sub_shape=cute.shape(thr_copy.partition_S(sC))[:3],
            sC=sC,
            epi_tile=epi_tile,
            epi_stages=epi_stages,
            epi_group=epi_group,
            out_dtype=out_dtype,
            barrier=pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=group_threads),
        )

    @cute.jit
    def store_tile(
        self,
        accumulators: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        gC_tile: cute.Tensor,
        ring_start: Int32,
        is_store_warp: cutlass.Boolean,
    ):
        """Write one tile; `ring_start` counts the sub-tiles stored before it by this group."""
        # The accumulators in the copy's register order: sub-tile i (row-major over the
        # sub-tile grid) is registers [i * S, (i + 1) * S) of this identity-ordered view.
        tRS_rAcc = self.tiled_copy_r2s.retile(accumulators)
        sub_size = cute.size(self.sub_shape)
        if cutlass.const_expr(any(tRS_rAcc.layout(i) != i for i in range(cute.size(tRS_rAcc)))):
            raise ValueError(f"accumulator view {tRS_rAcc.layout} is not in register order")
        gC_epi = cute.zipped_divide(gC_tile, self.epi_tile)
        bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(
            tma_atom_c,
            0,
            cute.make_layout(1),
            cute.group_modes(self.sC, 0, 2),
            gC_epi,
        )
        subtiles_m = cute.size(gC_epi, mode=[1, 0])
        subtiles_n = cute.size(gC_epi, mode=[1, 1])
        subtiles = subtiles_m * subtiles_n
        tRS_rC = cute.make_rmem_tensor(self.sub_shape, accumulators.element_type)
        tRS_rOut = cute.make_rmem_tensor(self.sub_shape, self.out_dtype)
        groups = subtile_groups(subtiles, self.epi_stages, self.epi_group)
        # Sub-tiles go out in groups: the group's shared writes, one fence and one barrier,
        # then the store warp's TMA stores (one bulk group per sub-tile). The barrier also
        # frees the next group's buffers, because before it the store warp has waited until
        # the stores that last read them are done. Barriers and fences, not the stores, bound
        # the epilogue of a tile of many narrow sub-tiles, hence the groups.
        if is_store_warp:
            cute.arch.cp_async_bulk_wait_group(groups[0][1], read=True)
        self.barrier.arrive_and_wait()
        first = 0
        for g in cutlass.range_constexpr(len(groups)):
            size = groups[g][0]
            for sub in cutlass.range_constexpr(first, first + size):
                for v in cutlass.range_constexpr(sub_size):
                    tRS_rC[v] = tRS_rAcc[sub * sub_size + v]
                tRS_rOut.store(tRS_rC.load().to(self.out_dtype))
                buffer = (ring_start + sub) % self.epi_stages
                cute.copy(self.tiled_copy_r2s, tRS_rOut, self.tRS_sC[(None, None, None, buffer)])
            # make the generic-proxy shared writes visible to the TMA (async proxy)
            cute.arch.fence_proxy("async.shared", space="cta")
            if cutlass.const_expr(g + 1 < len(groups)):
                if is_store_warp:
                    cute.arch.cp_async_bulk_wait_group(groups[g + 1][1], read=True)
            self.barrier.arrive_and_wait()
            if is_store_warp:
                for sub in cutlass.range_constexpr(first, first + size):
                    buffer = (ring_start + sub) % self.epi_stages
                    sub_m, sub_n = divmod(sub, subtiles_n)
                    cute.copy(tma_atom_c, bSG_sC[(None, buffer)], bSG_gC[(None, (sub_m, sub_n))])
                    cute.arch.cp_async_bulk_commit_group()
            first += size

    @cute.jit
    def finish(self, is_store_warp: cutlass.Boolean):
        """Wait until the TMA stores issued so far have read their shared buffers."""
        if is_store_warp:
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    def subtiles(self, tile_shape_mn: tuple) -> int:
        return (tile_shape_mn[0] // self.epi_tile[0]) * (tile_shape_mn[1] // self.epi_tile[1])


def subtile_groups(subtiles: int, stages: int, largest: int) -> list[tuple[int, int]]:
    """How a tile's sub-tiles are stored: (size, in_flight) per group, in order.

    Groups hold at most `largest` sub-tiles (at most half the `stages` buffers: while one group
    is written, the stores of the one before may still read theirs) and are as even as that
    allows. `in_flight` is how many of the stores committed when the group's buffers are
    claimed may still be reading: for the first group, claimed after every earlier tile's
    stores; for a later one, before the group ahead of it has committed its own.
    """
    largest = max(1, min(largest, stages // 2))
    count = -(-subtiles // largest)
    base, extra = divmod(subtiles, count)
    sizes = [base + 1 if i < extra else base for i in range(count)]
    return [(size, stages - size - (sizes[i - 1] if i else 0)) for i, size in enumerate(sizes)]


@cute.jit
def store_direct(
    accumulators: cute.Tensor,
    thr_mma,
    gC_tile: cute.Tensor,
    cC_tile: cute.Tensor,
    extent_mn: tuple,
    out_dtype: cutlass.Constexpr,
):
    """Write one tile from registers to global memory, skipping elements past the edges.

    `gC_tile` is the tile of the output, `cC_tile` the same tile of (m, n) coordinates.
    """
    tCgC = thr_mma.partition_C(gC_tile)
    tCcC = thr_mma.partition_C(cC_tile)
    values = cute.make_rmem_tensor(accumulators.shape, out_dtype)
    values.store(accumulators.load().to(out_dtype))
    for i in cutlass.range_constexpr(cute.size(values)):
        coord = tCcC[i]
        if coord[0] < extent_mn[0] and coord[1] < extent_mn[1]:
            tCgC[i] = values[i]
