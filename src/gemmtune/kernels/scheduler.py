"""Device side of the schedules in `schedule_model.py`, which it follows line for line.

A scheduler walks *positions*: a unit index (data-parallel), an item index (split-K), or a
global MAC-iteration index (stream-K, whose data-parallel phase steps a whole unit at a time).
`item(pos)` decodes a position into the `WorkItem` fields and the next position; the only value
a loop carries is the position. Nothing branches on the raster, and the split count is a value
too, so raster, swizzle and splits are kernel arguments that never change the binary.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from gemmtune.kernels.schedule_model import MAX_SK_SEGMENTS


def _pick(flag, if_true, if_false):
    """`if_true` where `flag` (a 0/1 Int32) is 1, else `if_false`, without a branch."""
    return if_false + flag * (if_true - if_false)


def unit_coord(unit: Int32, clusters_m: Int32, clusters_n: Int32, along_n: Int32, swizzle: Int32):
    """(cluster_m_idx, cluster_n_idx, batch) of work unit `unit`: `schedule_model.unit_coord`."""
    per_batch = clusters_m * clusters_n
    batch = unit // per_batch
    rest = unit - batch * per_batch
    fast = clusters_m + along_n * (clusters_n - clusters_m)
    slow = clusters_n + along_n * (clusters_m - clusters_n)
    band_units = swizzle * fast
    band = rest // band_units
    within = rest - band * band_units
    width = cutlass.min(swizzle, slow - band * swizzle)
    fast_idx = within // width
    slow_idx = band * swizzle + within - fast_idx * width
    m_idx = fast_idx + along_n * (slow_idx - fast_idx)
    n_idx = slow_idx + along_n * (fast_idx - slow_idx)
    return m_idx, n_idx, batch


def balanced_begin(index: Int32, parts: Int32, total: Int32) -> Int32:
    """`schedule_model.balanced_range(index, parts, total)[0]`."""
    q = total // parts
    r = total - q * parts
    return index * q + cutlass.min(index, r)


def share_blocks(segment: Int32, segments: Int32, blocks: int, threads: int, thread: Int32):
    """`schedule_model.share_blocks`."""
    vectors = blocks * threads
    begin = balanced_begin(segment, segments, vectors)
    end = balanced_begin(segment + 1, segments, vectors)
    return (begin - thread + threads - 1) // threads, (end - thread + threads - 1) // threads


def part_of(position: Int32, parts: Int32, total: Int32) -> Int32:
    """`schedule_model.part_of`."""
    q = total // parts
    r = total - q * parts
    long_parts = r * (q + 1)
    in_long = Int32(position < long_parts)
    return _pick(in_long, position // (q + 1), r + (position - long_parts) // cutlass.max(q, 1))


@dataclass(frozen=True)
class TileScheduler:
    """The constants of one launch's schedule. Frozen, so the DSL's loops read it rather than
    carry it. Built by `create` on the host side of the launch, in the kernel by the fields."""

    decomposition: str  # compile time: "data_parallel" | "split_k" | "stream_k"
    cluster_shape_mn: tuple  # compile time
    clusters_m: Int32
    clusters_n: Int32
    work_units: Int32
    k_tiles: Int32
    grid_clusters: Int32
    splits: Int32  # split-K: effective split count
    dp_units: Int32  # stream-K: units of the data-parallel phase
    along_n: Int32
    swizzle: Int32

    @staticmethod
    def create(
        decomposition: str,
        cluster_shape_mn: tuple,
        tiles_m: Int32,
        tiles_n: Int32,
        batches: Int32,
        k_tiles: Int32,
        splits: Int32,
        max_active_clusters: Int32,
        along_n: Int32,
        swizzle: Int32,
    ) -> "TileScheduler":
        """The schedule of `schedule_model.make_schedule` for one problem and GPU."""
        clusters_m = (tiles_m + cluster_shape_mn[0] - 1) // cluster_shape_mn[0]
        clusters_n = (tiles_n + cluster_shape_mn[1] - 1) // cluster_shape_mn[1]
        units = clusters_m * clusters_n * batches
        effective_splits = cutlass.max(
            cutlass.min(cutlass.min(splits, k_tiles), max_active_clusters), 1
        )
        dp_units = units
        if decomposition == "split_k":
            # `schedule_model.split_k_grid`
            items = units * effective_splits
            whole_rounds = (max_active_clusters // effective_splits) * effective_splits
            grid = cutlass.max(_pick(Int32(items <= max_active_clusters), items, whole_rounds), 1)
        elif decomposition == "stream_k":
            # `StreamKSchedule.sk_units`: the partial wave, or every unit when fewer than a wave
            grid = max_active_clusters
            tail = units - (units // grid) * grid
            sk_units = _pick(Int32(units < grid), units, tail)
            dp_units = units - sk_units
        else:
            # `TileGrid.grid_clusters`: as few clusters as finish in the same rounds
            rounds = cutlass.max((units + max_active_clusters - 1) // max_active_clusters, 1)
            grid = cutlass.max((units + rounds - 1) // rounds, 1)
        return TileScheduler(
            decomposition,
            cluster_shape_mn,
            clusters_m,
            clusters_n,
            units,
            k_tiles,
            grid,
            effective_splits,
            dp_units,
            along_n,
            swizzle,
        )

    @staticmethod
    def for_tensors(
        decomposition: str,
        cluster_shape_mn: tuple,
        tile_mnk: tuple,
        mA: cute.Tensor,
        mC: cute.Tensor,
        splits: Int32,
        max_active_clusters: Int32,
        along_n: Int32,
        swizzle: Int32,
    ) -> "TileScheduler":
        """`create` for a launch on A (M, K, L) and C (M, N, L) in tiles of `tile_mnk`: the
        tile counts from the tensors' extents."""
        tile_m, tile_n, tile_k = tile_mnk
        return TileScheduler.create(
            decomposition,
            cluster_shape_mn,
            Int32((mC.shape[0] + tile_m - 1) // tile_m),
            Int32((mC.shape[1] + tile_n - 1) // tile_n),
            Int32(mC.shape[2]),
            Int32((mA.shape[1] + tile_k - 1) // tile_k),
            splits,
            max_active_clusters,
            along_n,
            swizzle,
        )

    # -- positions -----------------------------------------------------------------------

    def _sk_range(self, cluster: Int32):
        """[begin, end) of `cluster`'s stream-K iterations, as global iteration indices, and
        where its first item (the head of the range's last unit) starts."""
        dp_iterations = self.dp_units * self.k_tiles
        sk_units = self.work_units - self.dp_units
        sk_iterations = sk_units * self.k_tiles
        sk_clusters = self._sk_clusters()
        # clusters past `sk_clusters` get the empty range at the region's end
        begin = dp_iterations + balanced_begin(
            cutlass.min(cluster, sk_clusters), sk_clusters, sk_iterations
        )
        end = dp_iterations + balanced_begin(
            cutlass.min(cluster + 1, sk_clusters), sk_clusters, sk_iterations
        )
        last_unit_start = ((end - 1) // self.k_tiles) * self.k_tiles
        return begin, end, cutlass.max(begin, last_unit_start)

    def _sk_clusters(self) -> Int32:
        """`StreamKSchedule.sk_clusters` (at least 1, so that divisions by it are defined)."""
        sk_units = self.work_units - self.dp_units
        return cutlass.max(cutlass.min(self.grid_clusters, sk_units * MAX_SK_SEGMENTS), 1)

    def first_position(self, cluster: Int32) -> Int32:
        if self.decomposition == "stream_k":
            in_dp = Int32(cluster < self.dp_units)
            return _pick(in_dp, cluster * self.k_tiles, self._sk_range(cluster)[2])
        return cluster

    def valid(self, position: Int32, cluster: Int32):
        if self.decomposition == "stream_k":
            return position < self._sk_range(cluster)[1]
        if self.decomposition == "split_k":
            return position < self.work_units * self.splits
        return position < self.work_units

    def item(self, position: Int32, cluster: Int32) -> tuple:
        """The `WorkItem` at `position` and the next position, as a tuple: (unit, k_begin,
        k_end, segment, segments, partial_slot, first_slot, counter, owner, next_position)."""
        if self.decomposition == "split_k":
            unit = position // self.splits
            split = position - unit * self.splits
            k_begin = balanced_begin(split, self.splits, self.k_tiles)
            k_end = balanced_begin(split + 1, self.splits, self.k_tiles)
            next_position = position + self.grid_clusters
            first_slot = unit * self.splits
            scattered = Int32(-1)  # no owner: every split reduces a share
            return (
                unit, k_begin, k_end, split, self.splits, position, first_slot, unit, scattered,
                next_position,
            )  # fmt: skip
        if self.decomposition == "stream_k":
            # positions run [head, end) then [begin, head): `StreamKSchedule.items`
            dp_iterations = self.dp_units * self.k_tiles
            sk_iterations = (self.work_units - self.dp_units) * self.k_tiles
            sk_begin, sk_end, head = self._sk_range(cluster)
            in_dp = Int32(position < dp_iterations)
            at_head = Int32(position == head)
            unit = position // self.k_tiles
            k_begin = position - unit * self.k_tiles
            piece_end = _pick(at_head, sk_end, head)
            k_end = _pick(in_dp, self.k_tiles, piece_end - unit * self.k_tiles)
            local_unit = unit - self.dp_units
            local_start = local_unit * self.k_tiles
            sk_clusters = self._sk_clusters()
            first = part_of(local_start, sk_clusters, sk_iterations)
            last = part_of(local_start + self.k_tiles - 1, sk_clusters, sk_iterations)
            segments = _pick(in_dp, Int32(1), last - first + 1)
            dp_next = position + self.grid_clusters * self.k_tiles
            dp_next = _pick(Int32(dp_next < dp_iterations), dp_next, head)
            sk_next = _pick(at_head * Int32(head > sk_begin), sk_begin, sk_end)
            next_position = _pick(in_dp, dp_next, sk_next)
            return (
                unit,
                k_begin,
                k_end,
                cluster - first,
                segments,
                cluster + local_unit,
                first + local_unit,
                local_unit,
                segments - 1,
                next_position,
            )
        next_position = position + self.grid_clusters
        zero = Int32(0)
        return position, zero, self.k_tiles, zero, Int32(1), zero, zero, zero, zero, next_position

    def tile_of_unit(self, unit: Int32, cta_in_cluster: tuple):
        """(tile_m_idx, tile_n_idx, batch) this CTA computes for `unit`."""
        cm, cn, batch = unit_coord(
            unit, self.clusters_m, self.clusters_n, self.along_n, self.swizzle
        )
        return (
            cm * self.cluster_shape_mn[0] + cta_in_cluster[0],
            cn * self.cluster_shape_mn[1] + cta_in_cluster[1],
            batch,
        )


def cluster_index() -> Int32:
    """This CTA's cluster's index in the persistent grid (clusters are laid out along z)."""
    return cute.arch.block_idx()[2]
