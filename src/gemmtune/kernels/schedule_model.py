"""The tile schedules of our persistent kernels, in plain Python.

This is the source of truth for index arithmetic. The device code (`kernels/scheduler.py`)
follows it line for line, the host side uses it to size grids, and the tests check its
properties on the CPU.

Vocabulary. The output is cut into tiles of `tile_m x tile_n`; tiles are grouped into clusters
of `cluster_m x cluster_n` tiles, and a *work unit* is one cluster's worth of tiles in one batch
(every CTA of a cluster works on the same unit, each on its own tile of it). Work units are
numbered 0, 1, 2, ...; the persistent grid has G clusters, and cluster c takes units c, c + G,
c + 2G, ... (with ping-pong, its two consumer warpgroups take alternate ones of those).

Order of units (the *raster*): with `along_m` consecutive units walk down M, with `along_n`
along N. The `swizzle` S groups the other dimension into bands S clusters wide: a band is
walked to its end, S clusters across at a time, before the next band starts. S = 1 is plain
column-major (along_m) or row-major (along_n) order; a larger S keeps the tiles that run at
the same time on fewer rows and columns of A and B, so they share more of L2. The last band
is narrower when S does not divide the number of clusters. The batch index varies slowest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TileGrid:
    """How one problem's output is cut into tiles and clusters."""

    m: int
    n: int
    l: int
    tile_m: int
    tile_n: int
    cluster_m: int = 1
    cluster_n: int = 1

    @property
    def tiles_m(self) -> int:
        return ceil_div(self.m, self.tile_m)

    @property
    def tiles_n(self) -> int:
        return ceil_div(self.n, self.tile_n)

    @property
    def clusters_m(self) -> int:
        return ceil_div(self.tiles_m, self.cluster_m)

    @property
    def clusters_n(self) -> int:
        return ceil_div(self.tiles_n, self.cluster_n)

    @property
    def work_units(self) -> int:
        return self.clusters_m * self.clusters_n * self.l

    @property
    def tiles(self) -> int:
        """Output tiles that hold at least one element of the result."""
        return self.tiles_m * self.tiles_n * self.l

    def grid_clusters(self, max_active_clusters: int) -> int:
        """Clusters in the persistent grid: one per unit, at most as many as fit at once."""
        return max(1, min(self.work_units, max_active_clusters))


def unit_coord(
    unit: int, clusters_m: int, clusters_n: int, along_n: int, swizzle: int
) -> tuple[int, int, int]:
    """(cluster_m_idx, cluster_n_idx, batch) of work unit `unit`.

    Written with the integer operations the device code uses (no branches on the raster:
    `along_n` is 0 or 1 and selects by arithmetic), so that the two can be read side by side.
    """
    per_batch = clusters_m * clusters_n
    batch = unit // per_batch
    rest = unit - batch * per_batch
    fast = clusters_m + along_n * (clusters_n - clusters_m)
    slow = clusters_n + along_n * (clusters_m - clusters_n)
    band_units = swizzle * fast
    band = rest // band_units
    within = rest - band * band_units
    width = min(swizzle, slow - band * swizzle)
    fast_idx = within // width
    slow_idx = band * swizzle + within - fast_idx * width
    m_idx = fast_idx + along_n * (slow_idx - fast_idx)
    n_idx = slow_idx + along_n * (fast_idx - slow_idx)
    return m_idx, n_idx, batch


@dataclass(frozen=True)
class DataParallelSchedule:
    """Each work unit is computed whole (all of K) by one cluster."""

    grid: TileGrid
    along_n: bool = False
    swizzle: int = 1

    def unit_coord(self, unit: int) -> tuple[int, int, int]:
        g = self.grid
        return unit_coord(unit, g.clusters_m, g.clusters_n, int(self.along_n), self.swizzle)

    def order(self) -> list[tuple[int, int, int]]:
        """Cluster coordinates (m, n, batch) of the work units, in unit order."""
        return [self.unit_coord(u) for u in range(self.grid.work_units)]

    def units_of_cluster(self, cluster: int, grid_clusters: int) -> Iterator[int]:
        """The units persistent cluster `cluster` of `grid_clusters` works on, in order."""
        return iter(range(cluster, self.grid.work_units, grid_clusters))

    def tiles_of_unit(self, unit: int) -> list[tuple[int, int, int]]:
        """The (tile_m_idx, tile_n_idx, batch) of every CTA of the cluster working on `unit`,
        CTA rank order (m fastest); tiles past the edge of the output are included: their CTAs
        take part in the cluster's multicast loads and store nothing."""
        g = self.grid
        cm, cn, batch = self.unit_coord(unit)
        return [
            (cm * g.cluster_m + x, cn * g.cluster_n + y, batch)
            for y in range(g.cluster_n)
            for x in range(g.cluster_m)
        ]
