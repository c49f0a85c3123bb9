import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemmtune.kernels.schedule_model import (
    DataParallelSchedule,
    SplitKSchedule,
    StreamKSchedule,
    TileGrid,
    WorkItem,
    balanced_range,
    make_schedule,
    part_of,
    suggest_decomposition,
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
    assert g.grid_clusters(66) == 66
    assert g.grid_clusters(1000) == 96


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


def test_split_k_items_and_turnstile_ranks():
    g = TileGrid(m=512, n=512, l=1, tile_m=128, tile_n=128)  # 16 units
    s = SplitKSchedule(g, k_tiles=10, grid_clusters=132, splits=4)
    items = s.items(0) + s.items(1) + s.items(2) + s.items(3)
    assert items == [
        WorkItem(0, 0, 3, 0, 4, 0),
        WorkItem(0, 3, 6, 1, 4, 0),
        WorkItem(0, 6, 8, 2, 4, 0),
        WorkItem(0, 8, 10, 3, 4, 0),
    ]
    assert s.workspace_slots == 16
    assert s.workspace_bytes == 16 * (128 * 128 * 4 + 4)
    # more splits than k-tiles: the extra splits are dropped
    assert SplitKSchedule(g, 3, 132, splits=16).effective_splits == 3


def test_stream_k_hybrid_regions():
    g = TileGrid(m=1024, n=4352, l=1, tile_m=128, tile_n=128)  # 8 x 34 = 272 units
    s = StreamKSchedule(g, k_tiles=64, grid_clusters=132)
    assert s.sk_units == 272 % 132 + 132 and s.dp_units == 132
    assert s.items(5)[0] == WorkItem(5, 0, 64)
    # exactly one wave of whole units, no stream-K: pure data-parallel
    assert StreamKSchedule(TileGrid(132 * 64, 64, 1, 64, 64), 8, 132).sk_units == 0
    # fewer units than clusters: all of them are stream-K
    small = StreamKSchedule(TileGrid(512, 512, 1, 128, 128), 512, 132)
    assert small.sk_units == 16 and small.dp_units == 0


def simulate(schedule):
    """Run every cluster's items in order, an item with rank r waiting for rank r-1 of its
    unit to finish; fail on deadlock. Returns, per unit, the items in completion order."""
    queues = {c: list(schedule.items(c)) for c in range(schedule.grid_clusters)}
    done_rank = defaultdict(lambda: -1)
    finished = defaultdict(list)
    while any(queues.values()):
        progressed = False
        for queue in queues.values():
            while queue and (
                queue[0].segments == 1 or done_rank[queue[0].unit] == queue[0].rank - 1
            ):
                item = queue.pop(0)
                done_rank[item.unit] = item.rank
                finished[item.unit].append(item)
                progressed = True
        assert progressed, "deadlock: every cluster waits on another"
    return finished


def check_schedule(schedule):
    finished = simulate(schedule)
    units = schedule.grid.work_units
    assert sorted(finished) == list(range(units))
    slots = set()
    for unit, items in finished.items():
        # every k-tile of the unit exactly once
        covered = sorted(k for it in items for k in range(it.k_begin, it.k_end))
        assert covered == list(range(schedule.k_tiles)), (unit, items)
        # one writer, ranks in turnstile order
        assert [it.rank for it in items] == list(range(len(items)))
        assert all(it.segments == len(items) for it in items)
        assert sum(it.final for it in items) == 1 and items[-1].final
        if len(items) > 1:
            assert len({it.slot for it in items}) == 1 and items[0].slot >= 0
            slots.add(items[0].slot)
        assert all(it.k_end > it.k_begin for it in items)
    assert len(slots) <= schedule.workspace_slots
    return finished


grids = st.builds(
    TileGrid,
    m=st.integers(1, 4096),
    n=st.integers(1, 4096),
    l=st.integers(1, 3),
    tile_m=st.sampled_from([64, 128, 256]),
    tile_n=st.sampled_from([64, 128, 192, 256]),
    cluster_m=st.sampled_from([1, 2]),
    cluster_n=st.sampled_from([1, 2]),
)


@settings(max_examples=300, deadline=None)
@given(
    grid=grids,
    k_tiles=st.integers(1, 600),
    resident=st.integers(1, 132),
    decomposition=st.sampled_from(["data_parallel", "split_k", "stream_k"]),
    splits=st.integers(2, 16),
)
def test_every_k_tile_once_every_tile_written_once_no_deadlock(
    grid, k_tiles, resident, decomposition, splits
):
    schedule = make_schedule(decomposition, grid, k_tiles, resident, splits=splits)
    # the grid never holds more clusters than are resident at once
    assert 1 <= schedule.grid_clusters <= resident
    check_schedule(schedule)


@settings(max_examples=100, deadline=None)
@given(grid=grids, k_tiles=st.integers(1, 600), resident=st.integers(1, 132))
def test_the_suggestion_is_a_valid_schedule(grid, k_tiles, resident):
    decomposition, splits = suggest_decomposition(grid, k_tiles, resident)
    assert decomposition in ("data_parallel", "split_k", "stream_k")
    assert 1 <= splits <= 16
    check_schedule(make_schedule(decomposition, grid, k_tiles, resident, splits=splits))


@pytest.mark.parametrize(
    ("m", "n", "k", "expected"),
    [
        (4096, 4096, 4096, "data_parallel"),  # 512 units of 128x256: a 7/8-full last wave
        (512, 512, 32768, "split_k"),  # 16 units leave most SMs idle, K is long
        (1024, 4352, 4096, "stream_k"),  # 136 units: a nearly empty second wave
        (128, 128, 128, "data_parallel"),  # one tiny unit, K too short to split
    ],
)
def test_suggestions_on_known_shapes(m, n, k, expected):
    grid = TileGrid(m, n, 1, 128, 256)
    assert suggest_decomposition(grid, -(-k // 64), 132)[0] == expected
