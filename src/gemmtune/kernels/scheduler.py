"""Device side of the tile schedules in `schedule_model.py`, which it follows line for line.

A `TileScheduler` lives in one warp's registers: it holds the runtime shape of the problem in
clusters, the raster and swizzle arguments, and the work unit it is on. Nothing here branches
on the raster, so raster and swizzle are kernel arguments that never change the binary.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32


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


@dataclass(frozen=True)
class TileScheduler:
    """Data-parallel persistent schedule: cluster c of a grid of G takes units c, c+G, c+2G...

    A ping-pong consumer warpgroup takes every other one of those units: it starts at
    `c + w*G` and steps by `2*G`. The unit a loop is on is the loop's own `Int32`; the
    scheduler only holds the problem's constants, and being frozen it is read, not carried,
    by the DSL's loops.
    """

    clusters_m: Int32
    clusters_n: Int32
    work_units: Int32
    along_n: Int32
    swizzle: Int32
    cluster_shape_mn: tuple

    @staticmethod
    def create(
        tiles_m: Int32,
        tiles_n: Int32,
        batches: Int32,
        cluster_shape_mn: tuple,
        along_n: Int32,
        swizzle: Int32,
    ) -> "TileScheduler":
        clusters_m = (tiles_m + cluster_shape_mn[0] - 1) // cluster_shape_mn[0]
        clusters_n = (tiles_n + cluster_shape_mn[1] - 1) // cluster_shape_mn[1]
        work_units = clusters_m * clusters_n * batches
        return TileScheduler(clusters_m, clusters_n, work_units, along_n, swizzle, cluster_shape_mn)

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

    def grid_clusters(self, max_active_clusters: Int32) -> Int32:
        """Clusters to launch: `TileGrid.grid_clusters`."""
        return cutlass.max(cutlass.min(self.work_units, max_active_clusters), 1)


def first_unit() -> Int32:
    """The unit a CTA starts on: its cluster's index in the grid (clusters along z)."""
    return cute.arch.block_idx()[2]


def unit_stride() -> Int32:
    """How far a CTA's successive units are apart: the number of clusters in the grid."""
    return cute.arch.grid_dim()[2]
