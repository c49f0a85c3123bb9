import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_strategies import grids

from gemmtune.kernels.schedule_model import (
    DataParallelSchedule,
    SplitKSchedule,
    StreamKSchedule,
    TileGrid,
    WorkItem,
    balanced_range,
    make_schedule,
    part_of,
    share_blocks,
)


def dp(grid, along_n=False, swizzle=1):
    return DataParallelSchedule(grid, 1, grid.grid_clusters(132), along_n, swizzle)


def order(schedule):
    return [schedule.unit_coord(u) for u in range(schedule.grid.work_units)]


def test_tile_grid_counts_ragged_edges():
    g = TileGrid(m=1001, n=1528, l=3, tile_m=128, tile_n=192, cluster_m=2, cluster_n=1)
    assert (g.tiles_m, g.tiles_n) == (8, 8)
    assert (g.clusters_m, g.clusters_n) == (4, 8)
    assert g.work_units == 4 * 8 * 3
    assert g.grid_clusters(1000) == 96
    assert g.grid_clusters(96) == 96
    # 96 units take two rounds on 66 clusters; 48 clusters finish them in two rounds as well
    assert g.grid_clusters(66) == 48
    assert g.grid_clusters(47) == 32  # three rounds


def test_a_2cta_grid_counts_mma_tiles_and_clusters_of_them():
    from gemmtune.core.config import GemmConfig

    config = GemmConfig(arch="sm_100", tile_m=256, tile_n=128, cluster_m=4, two_cta=True)
    g = TileGrid.of(config, 1001, 512, 1)
    assert (g.tiles_m, g.tiles_n) == (4, 4)  # 256-row MMA tiles, each on a CTA pair
    assert (g.cluster_m, g.clusters_m) == (2, 2)  # a 4-CTA cluster holds 2 MMA tiles along M


@given(units=st.integers(1, 5000), resident=st.integers(1, 200))
def test_data_parallel_grid_keeps_the_rounds_and_balances_them(units, resident):
    g = TileGrid(m=units * 64, n=64, l=1, tile_m=64, tile_n=64)
    clusters = g.grid_clusters(resident)
    rounds = -(-units // resident)
    assert 1 <= clusters <= min(units, resident)
    assert -(-units // clusters) == rounds  # no extra round
    if clusters > 1:
        assert -(-units // (clusters - 1)) > rounds  # none to spare


def test_swizzle_one_is_column_major_along_m_and_row_major_along_n():
    g = TileGrid(m=3 * 128, n=2 * 128, l=1, tile_m=128, tile_n=128)
    assert order(dp(g)) == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 1, 0), (1, 1, 0), (2, 1, 0)]
    assert order(dp(g, along_n=True)) == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0)
    ]  # fmt: skip


def test_swizzle_walks_bands_and_a_narrower_last_band():
    # 3 clusters down M, 5 across N, bands of 2 columns: [0,1], [2,3], then [4] alone
    g = TileGrid(m=3 * 64, n=5 * 64, l=1, tile_m=64, tile_n=64)
    expected = []
    for band in ([0, 1], [2, 3], [4]):
        for m in range(3):
            expected += [(m, n, 0) for n in band]
    assert order(dp(g, swizzle=2)) == expected
    # along N the roles swap: bands of 2 rows, walked along N
    expected = []
    for band in ([0, 1], [2]):
        for n in range(5):
            expected += [(m, n, 0) for m in band]
    assert order(dp(g, along_n=True, swizzle=2)) == expected


def test_batch_varies_slowest():
    g = TileGrid(m=256, n=256, l=3, tile_m=128, tile_n=128)
    assert [b for _, _, b in order(dp(g, swizzle=4))] == [0] * 4 + [1] * 4 + [2] * 4


def test_balanced_ranges_and_their_inverse():
    for total in (0, 1, 7, 130, 131, 132, 1000):
        for parts in (1, 3, 132):
            ranges = [balanced_range(i, parts, total) for i in range(parts)]
            assert ranges[0][0] == 0 and ranges[-1][1] == total
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
            assert max(e - b for b, e in ranges) - min(e - b for b, e in ranges) <= 1
            for i, (b, e) in enumerate(ranges):
                assert all(part_of(x, parts, total) == i for x in range(b, e))


def test_split_k_items_and_slots():
    g = TileGrid(m=512, n=512, l=1, tile_m=128, tile_n=128)  # 16 units
    s = SplitKSchedule(g, k_tiles=10, grid_clusters=132, splits=4)
    items = s.items(4) + s.items(5) + s.items(6) + s.items(7)
    assert items == [
        WorkItem(1, 0, 3, 0, 4, 4, 4, 1, -1),
        WorkItem(1, 3, 6, 1, 4, 5, 4, 1, -1),
        WorkItem(1, 6, 8, 2, 4, 6, 4, 1, -1),
        WorkItem(1, 8, 10, 3, 4, 7, 4, 1, -1),
    ]
    # every split publishes, then reduces and writes a share
    assert all(it.scattered and it.publishes and it.writes for it in items)
    assert (s.partial_slots, s.counters) == (64, 16)
    assert s.workspace_bytes == 64 * 128 * 128 * 4 + 16 * 4
    # more splits than k-tiles: the extra splits are dropped
    assert SplitKSchedule(g, 3, 132, splits=16).effective_splits == 3


@pytest.mark.parametrize(
    ("blocks", "threads", "segments"),
    [
        (16, 256, 8),
        (16, 256, 32),
        (16, 256, 128),
        (4, 128, 32),
        (1, 128, 16),
        (32, 256, 2),
        (3, 128, 5),
    ],
)
def test_split_k_shares_cover_each_block_once_and_keep_every_segment_busy(
    blocks, threads, segments
):
    owner = {}
    per_segment = []
    for segment in range(segments):
        vectors = []
        for thread in range(threads):
            first, end = share_blocks(segment, segments, blocks, threads, thread)
            assert 0 <= first <= end <= blocks
            for block in range(first, end):
                assert (block, thread) not in owner
                owner[block, thread] = segment
                vectors.append(block * threads + thread)
        per_segment.append(sorted(vectors))
    assert len(owner) == blocks * threads
    # a segment's vectors are one contiguous run (consecutive threads, coalesced loads), and
    # the segments' runs differ by at most one vector: no segment idles while another sums
    for vectors in per_segment:
        assert vectors == list(range(vectors[0], vectors[0] + len(vectors)))
    sizes = [len(v) for v in per_segment]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_split_k_grid_holds_whole_rounds_of_splits():
    g = TileGrid(m=4096, n=4096, l=1, tile_m=128, tile_n=128)  # 1024 units
    s = make_schedule("split_k", g, 64, 132, splits=16)
    assert s.grid_clusters == 128  # 8 units' splits a round, not 132
    s = make_schedule("split_k", g, 64, 132, splits=3)
    assert s.grid_clusters == 132
    # more splits than resident clusters: cut to what is resident
    s = make_schedule("split_k", g, 64, 5, splits=16)
    assert (s.effective_splits, s.grid_clusters) == (5, 5)
    few = make_schedule("split_k", TileGrid(256, 256, 1, 128, 128), 64, 132, splits=16)
    assert few.grid_clusters == 4 * 16


def test_stream_k_hybrid_regions():
    g = TileGrid(m=1024, n=4352, l=1, tile_m=128, tile_n=128)  # 8 x 34 = 272 units
    s = StreamKSchedule(g, k_tiles=64, grid_clusters=132)
    # two whole waves data-parallel, the partial third one stream-K
    assert s.sk_units == 272 % 132 and s.dp_units == 264
    assert s.items(5)[:2] == [WorkItem(5, 0, 64), WorkItem(137, 0, 64)]
    # a thin region goes to 4 clusters per unit: 8 units x 64 k-tiles on 32 clusters
    assert s.sk_clusters == 32
    assert s.items(0)[-1] == WorkItem(264, 0, 16, 0, 4, 0, 0, 0, 3)
    assert s.items(40) == [WorkItem(40, 0, 64), WorkItem(172, 0, 64)]
    # exactly one wave of whole units, no stream-K: pure data-parallel
    assert StreamKSchedule(TileGrid(132 * 64, 64, 1, 64, 64), 8, 132).sk_units == 0
    # fewer units than clusters: all of them are stream-K
    small = StreamKSchedule(TileGrid(512, 640, 1, 128, 128), 101, 132)
    assert small.sk_units == 20 and small.dp_units == 0 and small.sk_clusters == 80
    # 20 x 101 iterations on 80 clusters: 26 each for the first 20, then 25; so unit 0 spans
    # clusters 0..3, and cluster 3 runs unit 1's head before unit 0's tail
    unit0 = [it for c in range(4) for it in small.items(c) if it.unit == 0]
    assert [it.segment for it in unit0] == list(range(4))
    assert {it.first_slot for it in unit0} == {0} and {it.counter for it in unit0} == {0}
    assert [it.partial_slot for it in unit0] == list(range(4))
    assert [it.writes for it in unit0] == [False] * 3 + [True]
    assert [(it.unit, it.k_begin, it.k_end) for it in small.items(3)] == [(1, 0, 3), (0, 78, 101)]
    assert small.items(80) == []
    assert small.partial_slots == 80 + 20 - 1


def check_stream_k_order(schedule: StreamKSchedule):
    """Each cluster's stream-K items climb in k with at most one jump: a head (from k = 0) of
    one unit, then a tail (to the last k-tile) of the unit before; or one item alone."""
    for c in range(schedule.grid_clusters):
        region = [it for it in schedule.items(c) if it.unit >= schedule.dp_units]
        assert len(region) <= 2, region
        if len(region) == 2:
            head, tail = region
            assert head.k_begin == 0 and tail.k_end == schedule.k_tiles
            assert head.unit == tail.unit + 1


def simulate(schedule):
    """Run every cluster's items in order. An item publishes its partial sums when its cluster
    reaches it; an owner then waits until every other segment of its unit has published, a
    scattered segment until all of them have. Fails on deadlock; returns the items in
    completion order."""
    queues = {c: list(schedule.items(c)) for c in range(schedule.grid_clusters)}
    published = defaultdict(int)
    waiting = set()  # id() of items that have published and wait
    finished = []
    while any(queues.values()):
        progressed = False
        for queue in queues.values():
            while queue:
                item = queue[0]
                if item.publishes and id(item) not in waiting:
                    published[item.unit] += 1
                    waiting.add(id(item))
                    progressed = True
                if item.writes and item.shared:
                    needed = item.segments if item.scattered else item.segments - 1
                    if published[item.unit] < needed:
                        break
                queue.pop(0)
                finished.append(item)
                progressed = True
        assert progressed, "deadlock: every cluster waits on another"
    return finished


def check_schedule(schedule):
    """Every k-tile of every unit computed exactly once; a shared unit's segments in k order
    with distinct partial slots; one writer per unit (it finishes last), or a share written by
    every segment of a scattered unit; and no deadlock."""
    items = simulate(schedule)
    by_unit = defaultdict(list)
    for it in items:
        by_unit[it.unit].append(it)
    assert sorted(by_unit) == list(range(schedule.grid.work_units))
    partial_slots = [it.partial_slot for it in items if it.shared]
    assert len(partial_slots) == len(set(partial_slots))
    assert all(0 <= s < schedule.partial_slots for s in partial_slots)
    for unit, unit_items in by_unit.items():
        if any(it.scattered for it in unit_items):
            assert all(it.scattered and it.writes for it in unit_items)
        else:
            assert unit_items[-1].writes and sum(it.writes for it in unit_items) == 1
        unit_items.sort(key=lambda it: it.segment)
        covered = [k for it in unit_items for k in range(it.k_begin, it.k_end)]
        assert covered == list(range(schedule.k_tiles)), (unit, unit_items)
        assert all(it.k_end > it.k_begin for it in unit_items)
        assert [it.segment for it in unit_items] == list(range(len(unit_items)))
        assert all(it.segments == len(unit_items) for it in unit_items)
        if len(unit_items) > 1:
            assert len({(it.first_slot, it.counter, it.owner) for it in unit_items}) == 1
            assert all(it.partial_slot == it.first_slot + it.segment for it in unit_items)
            assert 0 <= unit_items[0].counter < schedule.counters


@settings(max_examples=300, deadline=None)
@given(
    grid=grids,
    k_tiles=st.integers(1, 600),
    resident=st.integers(1, 132),
    decomposition=st.sampled_from(["data_parallel", "split_k", "stream_k"]),
    splits=st.integers(2, 16),
)
def test_every_k_tile_once_every_tile_written_once(grid, k_tiles, resident, decomposition, splits):
    schedule = make_schedule(decomposition, grid, k_tiles, resident, splits=splits)
    # the grid never holds more clusters than are resident at once
    assert 1 <= schedule.grid_clusters <= resident
    check_schedule(schedule)
    if decomposition == "stream_k":
        check_stream_k_order(schedule)


def test_the_simulation_finds_a_deadlock():
    # one cluster holding both splits of a unit publishes the first and waits for the second,
    # which is queued behind it: what a grid smaller than the split count would do
    class OneCluster:
        grid_clusters = 1

        def items(self, cluster):
            return [WorkItem(0, 0, 1, 0, 2, 0, 0, 0, -1), WorkItem(0, 1, 2, 1, 2, 1, 0, 0, -1)]

    with pytest.raises(AssertionError, match="deadlock"):
        simulate(OneCluster())
