from hypothesis import given
from hypothesis import strategies as st

from gemmtune.kernels.schedule_model import DataParallelSchedule, TileGrid, ceil_div


def test_tile_grid_counts_ragged_edges():
    g = TileGrid(m=1001, n=1528, l=3, tile_m=128, tile_n=192, cluster_m=2, cluster_n=1)
    assert (g.tiles_m, g.tiles_n) == (8, 8)
    assert (g.clusters_m, g.clusters_n) == (4, 8)
    assert g.work_units == 4 * 8 * 3
    assert g.grid_clusters(66) == 66
    assert g.grid_clusters(1000) == 96


def test_swizzle_one_is_column_major_along_m_and_row_major_along_n():
    g = TileGrid(m=3 * 128, n=2 * 128, l=1, tile_m=128, tile_n=128)
    along_m = DataParallelSchedule(g).order()
    assert along_m == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 1, 0), (1, 1, 0), (2, 1, 0)]
    along_n = DataParallelSchedule(g, along_n=True).order()
    assert along_n == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0)]


def test_swizzle_walks_bands_and_a_narrower_last_band():
    # 3 clusters down M, 5 across N, bands of 2 columns: [0,1], [2,3], then [4] alone
    g = TileGrid(m=3 * 64, n=5 * 64, l=1, tile_m=64, tile_n=64)
    order = DataParallelSchedule(g, swizzle=2).order()
    expected = []
    for band in ([0, 1], [2, 3], [4]):
        for m in range(3):
            expected += [(m, n, 0) for n in band]
    assert order == expected
    # along N the roles swap: bands of 2 rows, walked along N
    order = DataParallelSchedule(g, along_n=True, swizzle=2).order()
    expected = []
    for band in ([0, 1], [2]):
        for n in range(5):
            expected += [(m, n, 0) for m in band]
    assert order == expected


def test_batch_varies_slowest():
    g = TileGrid(m=256, n=256, l=3, tile_m=128, tile_n=128)
    order = DataParallelSchedule(g, swizzle=4).order()
    assert [b for _, _, b in order] == [0] * 4 + [1] * 4 + [2] * 4


@given(
    m=st.integers(1, 3000),
    n=st.integers(1, 3000),
    l=st.integers(1, 4),
    tile_m=st.sampled_from([64, 128, 256]),
    tile_n=st.sampled_from([64, 96, 128, 192, 256]),
    cluster_m=st.sampled_from([1, 2]),
    cluster_n=st.sampled_from([1, 2]),
    along_n=st.booleans(),
    swizzle=st.sampled_from([1, 2, 4, 8]),
    grid_clusters=st.integers(1, 140),
)
def test_every_tile_is_computed_exactly_once(
    m, n, l, tile_m, tile_n, cluster_m, cluster_n, along_n, swizzle, grid_clusters
):
    g = TileGrid(m, n, l, tile_m, tile_n, cluster_m, cluster_n)
    sched = DataParallelSchedule(g, along_n=along_n, swizzle=swizzle)
    order = sched.order()
    assert sorted(order) == sorted(
        (cm, cn, b) for cm in range(g.clusters_m) for cn in range(g.clusters_n) for b in range(l)
    )
    clusters = g.grid_clusters(grid_clusters)
    seen = []
    for c in range(clusters):
        for unit in sched.units_of_cluster(c, clusters):
            seen += [t for t in sched.tiles_of_unit(unit) if t[0] < g.tiles_m and t[1] < g.tiles_n]
    assert len(seen) == len(set(seen)) == g.tiles
    assert clusters <= grid_clusters
    assert ceil_div(g.work_units, clusters) * clusters >= g.work_units
