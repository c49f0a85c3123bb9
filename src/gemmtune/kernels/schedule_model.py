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

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gemmtune.core.config import GemmConfig


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

    @classmethod
    def of(cls, config: GemmConfig, m: int, n: int, l: int) -> TileGrid:
        """How `config`'s kernel cuts an (m, n, l) output: for a `swap_ab` config, the
        transposed output (n, m, l), which its kernel computes. Tiles are MMA tiles, so a
        2-CTA config's cluster holds `cluster_m / 2` of them along M."""
        if config.swap_ab:
            m, n = n, m
        cluster_m = config.cluster_m // config.cta_group
        return cls(m, n, l, config.tile_m, config.tile_n, cluster_m, config.cluster_n)

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
        """Clusters in the data-parallel persistent grid: the fewest that finish the units in
        as many rounds as every resident cluster would, so that each cluster computes the
        same number of units (one more where they do not divide).

        Clusters beyond those add no round but draw power: a GPU that runs large GEMMs at
        its power cap then lowers the clock of all the others.
        """
        rounds = max(1, ceil_div(self.work_units, max_active_clusters))
        return max(1, ceil_div(self.work_units, rounds))


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
class WorkItem:
    """A range of k-tiles of one work unit that one cluster computes without interruption.

    When several items share a unit (`segments` > 1), each writes its partial sums to its own
    workspace slot (`partial_slot`; segment j's is `first_slot + j`) and counts itself in at
    the unit's arrival counter, except an owner (below). The sums are then reduced in one of
    two ways, both adding the partials in segment (k) order, so results never depend on timing:
    - one owner (`owner` >= 0, stream-K): the owner segment publishes nothing; it waits until
      every other segment has arrived, adds their partials to its accumulators, resets the
      counter and writes the unit. Owners are chosen to wait only on items that never wait
      before them: the last segment, computed at the end of its cluster's range.
    - scattered (`owner` == -1, split-K): every segment publishes, waits until all have, then
      reduces and writes its own share of the unit (`share_blocks`: range s of the tile's
      blocks of four accumulators, cut by `balanced_range`), so the reduction's reads are
      spread over all the segments instead of falling on one. The segments must run
      at the same time (`SplitKSchedule` sees to it); a second count of departures lets the
      last one reset the counter.
    """

    unit: int
    k_begin: int
    k_end: int
    segment: int = 0  # index among the unit's items, in k order
    segments: int = 1
    partial_slot: int = -1  # -1 when the unit is not shared
    first_slot: int = -1
    counter: int = -1
    owner: int = 0  # the segment that reduces and writes the unit; -1: every segment, a share

    @property
    def shared(self) -> bool:
        return self.segments > 1

    @property
    def scattered(self) -> bool:
        return self.shared and self.owner < 0

    @property
    def publishes(self) -> bool:
        """True for an item that writes its partial sums to the workspace."""
        return self.shared and self.segment != self.owner

    @property
    def writes(self) -> bool:
        """True for an item that writes (a share of) the unit's output."""
        return self.scattered or self.segment == self.owner


@dataclass(frozen=True)
class Schedule(abc.ABC):
    """A decomposition of the work: which items each persistent cluster computes, in order.

    `grid_clusters` must not exceed the clusters resident at once: items wait on items of
    other clusters, which therefore must all be running.
    """

    grid: TileGrid
    k_tiles: int
    grid_clusters: int
    along_n: bool = False
    swizzle: int = 1

    def unit_coord(self, unit: int) -> tuple[int, int, int]:
        g = self.grid
        return unit_coord(unit, g.clusters_m, g.clusters_n, int(self.along_n), self.swizzle)

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

    @abc.abstractmethod
    def items(self, cluster: int) -> list[WorkItem]:
        """The items persistent cluster `cluster` computes, in order."""

    @property
    def partial_slots(self) -> int:
        """Partial tiles the workspace holds (per CTA of a cluster)."""
        return 0

    @property
    def counters(self) -> int:
        """Arrival counters the workspace holds (per CTA of a cluster)."""
        return 0

    @property
    def workspace_bytes(self) -> int:
        """Bytes of fp32 partial tiles plus int32 counters the schedule needs."""
        g = self.grid
        ctas = g.cluster_m * g.cluster_n
        return ctas * (self.partial_slots * g.tile_m * g.tile_n * 4 + self.counters * 4)


@dataclass(frozen=True)
class DataParallelSchedule(Schedule):
    """Each unit is computed whole by one cluster: cluster c takes units c, c+G, c+2G, ..."""

    def items(self, cluster: int) -> list[WorkItem]:
        return [
            WorkItem(unit, 0, self.k_tiles)
            for unit in range(cluster, self.grid.work_units, self.grid_clusters)
        ]


def balanced_range(index: int, parts: int, total: int) -> tuple[int, int]:
    """[begin, end) of part `index` when `total` is cut into `parts` near-equal parts (the
    first `total % parts` parts are one longer)."""
    q, r = divmod(total, parts)
    begin = index * q + min(index, r)
    return begin, begin + q + (1 if index < r else 0)


def part_of(position: int, parts: int, total: int) -> int:
    """Which part of `balanced_range` holds `position`."""
    q, r = divmod(total, parts)
    long_parts = r * (q + 1)
    if position < long_parts:
        return position // (q + 1)
    return r + (position - long_parts) // max(q, 1)


def share_blocks(
    segment: int, segments: int, blocks: int, threads: int, thread: int
) -> tuple[int, int]:
    """[first, end) of the blocks (four floats each) that `thread` sums for split `segment`'s
    share of a tile that `threads` threads hold `blocks` blocks each of. The tile's blocks are
    numbered as the workspace interleaves them (block b of thread t is vector b * threads + t)
    and cut into `segments` near-equal ranges; a thread sums the blocks of its own that fall
    in its segment's range. Numbered so, consecutive threads take consecutive vectors (their
    loads coalesce) and every segment has a share while there are more vectors than segments,
    however few blocks a thread holds."""
    begin, end = balanced_range(segment, segments, blocks * threads)
    return ceil_div(begin - thread, threads), ceil_div(end - thread, threads)


@dataclass(frozen=True)
class SplitKSchedule(Schedule):
    """Every unit's k-tiles are cut into `splits` near-equal ranges, each its own item.

    Items are numbered unit-major (the splits of a unit are consecutive) and handed out like
    units in the data-parallel schedule; their sums are reduced scattered (`WorkItem`). A split
    waits on the other splits of its unit, so there are never more splits than clusters (a
    cluster holding two splits of one unit would wait on itself); and the grid is a multiple of
    the split count, so the splits of a unit fall in one round of the grid (items rG .. rG+G-1)
    and run at the same time, rather than some waiting for others queued behind a round of
    work. Splits beyond the number of k-tiles, or of resident clusters, are dropped.
    """

    splits: int = 2

    @property
    def effective_splits(self) -> int:
        return effective_splits(self.splits, self.k_tiles, self.grid_clusters)

    def items(self, cluster: int) -> list[WorkItem]:
        s = self.effective_splits
        out = []
        for item in range(cluster, self.grid.work_units * s, self.grid_clusters):
            unit, split = divmod(item, s)
            k_begin, k_end = balanced_range(split, s, self.k_tiles)
            if s == 1:
                out.append(WorkItem(unit, k_begin, k_end))
            else:
                out.append(WorkItem(unit, k_begin, k_end, split, s, item, unit * s, unit, -1))
        return out

    @property
    def partial_slots(self) -> int:
        return self.grid.work_units * self.effective_splits if self.effective_splits > 1 else 0

    @property
    def counters(self) -> int:
        return self.grid.work_units if self.effective_splits > 1 else 0


def effective_splits(splits: int, k_tiles: int, max_active_clusters: int) -> int:
    """The split count split-K runs with: at least 1, at most one split per k-tile and per
    resident cluster."""
    return max(1, min(splits, k_tiles, max_active_clusters))


def split_k_grid(work_units: int, splits: int, max_active_clusters: int) -> int:
    """Clusters of a split-K grid: one per item, or the most resident clusters that hold a
    whole number of units' splits."""
    items = work_units * splits
    if items <= max_active_clusters:
        return items
    return (max_active_clusters // splits) * splits


#: Segments a stream-K unit is cut into at most (about: ranges need not meet unit boundaries).
#: The owner reads the others' partial tiles, a tile's worth each, so past a few the reads cost
#: more than the shorter k-range saves.
MAX_SK_SEGMENTS = 4


@dataclass(frozen=True)
class StreamKSchedule(Schedule):
    """Hybrid stream-K: whole waves of units run data-parallel first; the units of the last,
    partial wave are the stream-K region: their MAC iterations (unit x k-tile, unit-major) are
    cut into one near-equal contiguous range per cluster, and a unit whose iterations span
    several clusters is shared between them. All of a problem's units form the region when
    there are fewer than the clusters. A thin region goes to fewer clusters, `sk_clusters`, so
    that a unit has at most about `MAX_SK_SEGMENTS` segments: spread over every cluster, 4
    units on 132 clusters would be cut 33 ways, and their owners would read 32 partial tiles.

    The region is the partial wave alone, so a range holds at most `k_tiles` iterations and
    meets at most two units: the end (a *tail*) of one and the start (a *head*) of the next. A
    cluster runs the head first, then the tail, so from the region's start every cluster's
    k-tiles climb from k = 0 with one jump (a range inside one unit starts where it lies):
    clusters load the same k-slices of A and B at about the same time, as data-parallel waves
    do, and L2 keeps serving them. (In iteration order each cluster would start at its own k,
    and the region would fetch A and B from HBM again.)

    Walking the region's iterations in order, a new item starts exactly when the cluster or
    the unit changes, so item (cluster c, region unit u) is item number c + u of the region:
    that is its partial slot, and the unit's segments sit in slots first..last cluster + u.
    The last segment owns the unit: its cluster reaches it at the end of its range, while every
    other segment is a head, run first, or a whole range inside the unit; none of those waits.
    """

    @property
    def sk_units(self) -> int:
        units, clusters = self.grid.work_units, self.grid_clusters
        return units if units < clusters else units % clusters

    @property
    def sk_clusters(self) -> int:
        """The clusters that share the stream-K region (the first ones)."""
        return min(self.grid_clusters, self.sk_units * MAX_SK_SEGMENTS)

    @property
    def dp_units(self) -> int:
        return self.grid.work_units - self.sk_units

    @property
    def sk_iterations(self) -> int:
        return self.sk_units * self.k_tiles

    def items(self, cluster: int) -> list[WorkItem]:
        out = [
            WorkItem(unit, 0, self.k_tiles)
            for unit in range(cluster, self.dp_units, self.grid_clusters)
        ]
        if cluster >= self.sk_clusters:
            return out
        begin, end = balanced_range(cluster, self.sk_clusters, self.sk_iterations)
        if begin == end:
            return out
        # at most two units (see the docstring): the head of the later one runs first
        first_unit, last_unit = begin // self.k_tiles, (end - 1) // self.k_tiles
        head_start = max(begin, last_unit * self.k_tiles)
        pieces = [(last_unit, head_start, end)]
        if head_start > begin:
            pieces.append((first_unit, begin, head_start))
        for local_unit, piece_begin, piece_end in pieces:
            unit_start = local_unit * self.k_tiles
            first = part_of(unit_start, self.sk_clusters, self.sk_iterations)
            last = part_of(unit_start + self.k_tiles - 1, self.sk_clusters, self.sk_iterations)
            unit = self.dp_units + local_unit
            k_begin, k_end = piece_begin - unit_start, piece_end - unit_start
            if first == last:
                out.append(WorkItem(unit, k_begin, k_end))
            else:
                out.append(
                    WorkItem(
                        unit,
                        k_begin,
                        k_end,
                        cluster - first,
                        last - first + 1,
                        cluster + local_unit,
                        first + local_unit,
                        local_unit,
                        last - first,
                    )
                )
        return out

    @property
    def partial_slots(self) -> int:
        return self.sk_clusters + self.sk_units - 1 if self.sk_units else 0

    @property
    def counters(self) -> int:
        return self.sk_units


def make_schedule(
    decomposition: str,
    grid: TileGrid,
    k_tiles: int,
    max_active_clusters: int,
    *,
    splits: int = 1,
    along_n: bool = False,
    swizzle: int = 1,
) -> Schedule:
    """The schedule of `decomposition` ("data_parallel", "split_k", "stream_k") for a problem."""
    common = {
        "grid": grid,
        "k_tiles": k_tiles,
        "along_n": along_n,
        "swizzle": swizzle,
    }
    if decomposition == "split_k":
        s = effective_splits(splits, k_tiles, max_active_clusters)
        clusters = split_k_grid(grid.work_units, s, max_active_clusters)
        return SplitKSchedule(grid_clusters=clusters, splits=s, **common)
    clusters = grid.grid_clusters(max_active_clusters)
    if decomposition == "stream_k":
        # stream-K keeps every resident cluster busy, even when there are fewer units
        return StreamKSchedule(grid_clusters=max_active_clusters, **common)
    return DataParallelSchedule(grid_clusters=clusters, **common)
