"""The TMA-store epilogue's grouping of sub-tiles: no buffer is rewritten while a store that
reads it may still be in flight, across tiles whose ring positions carry over."""

from __future__ import annotations

import itertools

import pytest

from gemmtune.kernels.sm90.epilogue import subtile_groups


def replay(subtiles: int, stages: int, tiles: int, largest: int | None = None) -> int:
    """Run `tiles` tiles through the ring the way `TmaStoreEpilogue.store_tile` does and
    return how many barriers it took; fail if a buffer is claimed too early.

    A store is modelled as possibly still reading its buffer until a wait lets at most
    `in_flight` of the committed stores remain."""
    groups = subtile_groups(subtiles, stages, stages // 2 if largest is None else largest)
    committed: list[int] = []  # buffer of every committed store, oldest first
    done = 0  # committed[:done] have finished reading
    barriers = 0
    stored = 0
    for _ in range(tiles):
        pending_group: list[int] = []
        for size, in_flight in groups:
            # the store warp waits, then a barrier hands the buffers to everyone
            done = max(done, len(committed) - in_flight)
            barriers += 1
            # the previous group's stores are committed after that same barrier
            committed.extend(pending_group)
            buffers = [(stored + i) % stages for i in range(size)]
            still_reading = set(committed[done:])
            assert not still_reading & set(buffers), (subtiles, stages, groups)
            pending_group = buffers
            stored += size
        barriers += 1  # the last group's closing barrier
        committed.extend(pending_group)
    return barriers


@pytest.mark.parametrize("stages", range(2, 17))
def test_groups_cover_the_tile_and_fit_the_ring_two_at_a_time(stages: int) -> None:
    for subtiles in range(1, 65):
        sizes = [size for size, _ in subtile_groups(subtiles, stages, stages // 2)]
        assert sum(sizes) == subtiles and min(sizes) >= 1
        assert max(sizes) - min(sizes) <= 1
        assert all(a + b <= stages for a, b in itertools.pairwise(sizes))
        assert len(sizes) == -(-subtiles // max(1, stages // 2))


@pytest.mark.parametrize("stages", range(2, 17))
def test_no_buffer_is_rewritten_while_its_store_may_read_it(stages: int) -> None:
    for subtiles in range(1, 40):
        replay(subtiles, stages, tiles=5)


def test_a_256x208_tile_takes_six_barriers_not_twenty_seven() -> None:
    # 26 sub-tiles of 128x16 in thirteen buffers (what rules.smem_plan leaves it)
    assert [size for size, _ in subtile_groups(26, 13, 6)] == [6, 5, 5, 5, 5]
    assert replay(26, 13, tiles=1) == 6
    # a sub-tile per group (what stream-K's widest tiles keep): a barrier per sub-tile
    assert replay(26, 4, tiles=1, largest=1) == 27


@pytest.mark.parametrize("largest", [1, 2, 3])
def test_a_smaller_group_limit_is_kept(largest: int) -> None:
    for subtiles in range(1, 30):
        assert max(size for size, _ in subtile_groups(subtiles, 13, largest)) <= largest
        replay(subtiles, 13, tiles=3, largest=largest)


def test_thread_stores_tile_every_sub_tile_with_warps_along_the_contiguous_mode():
    from gemmtune.kernels.sm90 import rules
    from gemmtune.kernels.sm90.epilogue import store_thread_shape

    # every binary with thread stores (widths of an odd number of 8-column blocks store
    # through TMA only)
    for config in (c for c in rules.implemented_configs() if not c.tma_store):
        epi_m, epi_n = rules.epi_tile(config)
        threads = rules.THREADS_PER_WARPGROUP
        if config.schedule.value == "cooperative":
            threads *= rules.consumer_warpgroups(config)
        for m_major in (False, True):
            rows, cols = store_thread_shape((epi_m, epi_n), threads, m_major)
            assert rows * cols == threads
            assert epi_m % rows == 0 and epi_n % cols == 0
            # a warp's 32 threads write consecutive elements of one row (column)
            contiguous = rows if m_major else cols
            assert contiguous % 32 == 0 or contiguous == epi_n == 16
            if m_major:  # a column's rows divide, or are whole, 64-row swizzle blocks
                assert 64 % rows == 0 or rows % 64 == 0
    with pytest.raises(ValueError):
        store_thread_shape((64, 16), 384, m_major=True)
