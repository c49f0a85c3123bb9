"""Hopper epilogue: accumulators (fp32, in registers) to the output tensor.

`StagedEpilogue` moves a tile sub-tile by sub-tile: registers -> shared memory (stmatrix for
16-bit outputs) -> global memory, by one of two stores, chosen by `GemmConfig.tma_store`:
- a TMA bulk store, issued by one warp; TMA clips at the tensor's edges. The shared buffers
  form a ring whose position carries over from tile to tile, so stores of one tile drain while
  the next tile's mainloop runs.
- thread stores, for outputs TMA cannot store (rows not a multiple of 16 bytes): the group's
  threads read each sub-tile back in rows (columns of an M-major output), so that a warp
  writes 32 consecutive elements, predicated on the output's bounds. Written straight from
  the accumulators' register layout instead, a warp's store touched eight rows at once, four
  32-byte sectors for every one written in full, and a 128x128 ping-pong tile's epilogue took
  longer than its mainloop (`docs/kernels.md`).
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32


def store_thread_shape(epi_tile: tuple, threads: int, m_major: bool) -> tuple[int, int]:
    """How the thread stores arrange `threads` threads over an (epi_m, epi_n) sub-tile: a warp
    along the output's contiguous mode (N, or M for an M-major output), 32 elements of it
    (N-major: all of a 16-wide sub-tile), the rest of the threads along the other mode.

    M-major: four columns at a time (4 divides every sub-tile width), or two for three
    warpgroups, whose 96 rows of a column would cut a 16-bit buffer's 64-row swizzle blocks
    unevenly (the DSL cannot partition them so); their 192 rows are three whole blocks."""
    epi_m, epi_n = epi_tile
    if m_major:
        columns = 4 if 64 % (threads // 4) == 0 or (threads // 4) % 64 == 0 else 2
        shape = (threads // columns, columns)
    else:
        along_n = min(epi_n, 32)
        shape = (threads // along_n, along_n)
    if epi_m % shape[0] or epi_n % shape[1]:
        raise ValueError(f"{threads} threads as {shape} do not tile a {epi_m}x{epi_n} sub-tile")
    return shape


@dataclass(frozen=True)
class StagedEpilogue:
    """What the epilogue of one consumer thread needs, built once per kernel.

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
    tma: bool
    store_threads: cute.Layout  # thread stores: the group's threads over a sub-tile
    thread_in_group: Int32

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
        tma: bool,
        out_m_major: bool,
    ) -> "StagedEpilogue":
        layout_donor = cute.make_tiled_copy_C_atom(stmatrix_atom, tiled_mma)
        tiled_copy_r2s = cute.make_tiled_copy_S(copy_atom_r2s, layout_donor)
        thr_copy = tiled_copy_r2s.get_slice(thread_in_group)
        shape = store_thread_shape(epi_tile, group_threads, out_m_major)
        # the thread index runs along the contiguous mode first
        stride = (1, shape[0]) if out_m_major else (shape[1], 1)
        return StagedEpilogue(
            tiled_copy_r2s=tiled_copy_r2s,
            tRS_sC=thr_copy.partition_D(sC),
            sub_shape=cute.shape(thr_copy.partition_S(sC))[:3],
            sC=sC,
            epi_tile=epi_tile,
            epi_stages=epi_stages,
            epi_group=epi_group,
            out_dtype=out_dtype,
            barrier=pipeline.NamedBarrier(barrier_id=barrier_id, num_threads=group_threads),
            tma=tma,
            store_threads=cute.make_layout(shape, stride=stride),
            thread_in_group=thread_in_group,
        )

    @cute.jit
    def store_tile(
        self,
        accumulators: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        gC_tile: cute.Tensor,
        cC_tile: cute.Tensor,
        extent_mn: tuple,
        ring_start: Int32,
        is_store_warp: cutlass.Boolean,
    ):
        """Write one tile; `ring_start` counts the sub-tiles stored before it by this group.

        `gC_tile` is the tile as the store addresses it (TMA: its coordinates), `cC_tile` the
        same tile of (m, n) coordinates and `extent_mn` the output's (thread stores only)."""
        # The accumulators in the copy's register order: sub-tile i (row-major over the
        # sub-tile grid) is registers [i * S, (i + 1) * S) of this identity-ordered view.
        tRS_rAcc = self.tiled_copy_r2s.retile(accumulators)
        sub_size = cute.size(self.sub_shape)
        if cutlass.const_expr(any(tRS_rAcc.layout(i) != i for i in range(cute.size(tRS_rAcc)))):
            raise ValueError(f"accumulator view {tRS_rAcc.layout} is not in register order")
        gC_epi = cute.zipped_divide(gC_tile, self.epi_tile)
        cC_epi = cute.zipped_divide(cC_tile, self.epi_tile)
        bSG_sC, bSG_gC = None, None
        if cutlass.const_expr(self.tma):
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
        # then the stores (TMA: the store warp's, one bulk group per sub-tile). The barrier
        # also frees the next group's buffers: before it the store warp has waited until the
        # TMA stores that last read them are done, and every thread has done its own reads.
        # Barriers and fences, not the stores, bound the epilogue of a tile of many narrow
        # sub-tiles, hence the groups.
        if cutlass.const_expr(self.tma):
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
            if cutlass.const_expr(self.tma):
                # make the generic-proxy shared writes visible to the TMA (async proxy)
                cute.arch.fence_proxy("async.shared", space="cta")
                if cutlass.const_expr(g + 1 < len(groups)):
                    if is_store_warp:
                        cute.arch.cp_async_bulk_wait_group(groups[g + 1][1], read=True)
            self.barrier.arrive_and_wait()
            for sub in cutlass.range_constexpr(first, first + size):
                buffer = (ring_start + sub) % self.epi_stages
                sub_m, sub_n = divmod(sub, subtiles_n)
                if cutlass.const_expr(self.tma):
                    if is_store_warp:
                        target = bSG_gC[(None, (sub_m, sub_n))]
                        cute.copy(tma_atom_c, bSG_sC[(None, buffer)], target)
                        cute.arch.cp_async_bulk_commit_group()
                else:
                    self._store_subtile(
                        self.sC[(None, None, buffer)],
                        gC_epi[((None, None), (sub_m, sub_n))],
                        cC_epi[((None, None), (sub_m, sub_n))],
                        extent_mn,
                    )
            first += size

    @cute.jit
    def _store_subtile(
        self, sub: cute.Tensor, gC_sub: cute.Tensor, cC_sub: cute.Tensor, extent_mn: tuple
    ):
        """This thread's share of a sub-tile, from its shared buffer to the output, skipping
        elements past the output's edges."""
        src = cute.local_partition(sub, self.store_threads, self.thread_in_group)
        dst = cute.local_partition(gC_sub, self.store_threads, self.thread_in_group)
        coords = cute.local_partition(cC_sub, self.store_threads, self.thread_in_group)
        for i in cutlass.range_constexpr(cute.size(src)):
            coord = coords[i]
            if coord[0] < extent_mn[0] and coord[1] < extent_mn[1]:
                dst[i] = src[i]

    @cute.jit
    def finish(self, is_store_warp: cutlass.Boolean):
        """Wait until the TMA stores issued so far have read their shared buffers (thread
        stores have read theirs before they return)."""
        if cutlass.const_expr(self.tma):
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
