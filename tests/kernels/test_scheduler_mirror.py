"""The device scheduler (`kernels/scheduler.py`) walks exactly the model's items and gives each
CTA the model's tile.

Its functions are plain arithmetic on the DSL's integers, so run on Python ints (with `min` and
`max` for the DSL's) they must produce `schedule_model`'s `WorkItem`s, cluster by cluster, in
order: the kernel and the host side (workspace sizes, the tuner's cost model, the property
tests) then agree on who computes, publishes and writes what.
"""

import types
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_strategies import grids

import gemmtune.kernels.scheduler as device
from gemmtune.kernels.schedule_model import make_schedule, share_blocks


def device_items(scheduler: device.TileScheduler, cluster: int) -> list[tuple]:
    """(unit, k_begin, k_end, segment, segments, partial_slot, first_slot, counter, owner) of
    each item the kernel's loop visits; the sharing fields only where the unit is shared (the
    kernel reads them only there)."""
    out = []
    position = scheduler.first_position(cluster)
    while scheduler.valid(position, cluster):
        *fields, position = scheduler.item(position, cluster)
        unit, k_begin, k_end, segment, segments, slot, first_slot, counter, owner = fields
        if segments == 1:
            segment, slot, first_slot, counter, owner = 0, -1, -1, -1, 0
        out.append((unit, k_begin, k_end, segment, segments, slot, first_slot, counter, owner))
    return out


@settings(max_examples=300, deadline=None)
@given(
    grid=grids,
    k_tiles=st.integers(1, 400),
    resident=st.integers(1, 132),
    decomposition=st.sampled_from(["data_parallel", "split_k", "stream_k"]),
    splits=st.integers(2, 16),
    along_n=st.integers(0, 1),
    swizzle=st.sampled_from([1, 2, 4, 8]),
)
def test_the_device_scheduler_walks_the_models_items(
    grid, k_tiles, resident, decomposition, splits, along_n, swizzle
):
    model = make_schedule(
        decomposition,
        grid,
        k_tiles,
        resident,
        splits=splits,
        along_n=bool(along_n),
        swizzle=swizzle,
    )
    python_ints = types.SimpleNamespace(min=min, max=max)
    with mock.patch.object(device, "cutlass", python_ints), mock.patch.object(device, "Int32", int):
        scheduler = device.TileScheduler.create(
            decomposition,
            (grid.cluster_m, grid.cluster_n),
            grid.tiles_m,
            grid.tiles_n,
            grid.l,
            k_tiles,
            splits,
            resident,
            along_n,
            swizzle,
        )
        assert scheduler.grid_clusters == model.grid_clusters
        for cluster in range(model.grid_clusters):
            expected = [
                (
                    it.unit, it.k_begin, it.k_end, it.segment, it.segments, it.partial_slot,
                    it.first_slot, it.counter, it.owner,
                )
                for it in model.items(cluster)
            ]  # fmt: skip
            assert device_items(scheduler, cluster) == expected, cluster
        # and each CTA of a unit's cluster computes the tile the model gives it (raster, bands)
        ctas = [(x, y) for y in range(grid.cluster_n) for x in range(grid.cluster_m)]
        for unit in {
            it.unit for cluster in range(model.grid_clusters) for it in model.items(cluster)
        }:
            tiles = [scheduler.tile_of_unit(unit, cta) for cta in ctas]
            assert tiles == model.tiles_of_unit(unit), unit


@settings(max_examples=200, deadline=None)
@given(
    segments=st.integers(1, 128),
    blocks=st.integers(1, 64),
    threads=st.sampled_from([128, 256, 384]),
    data=st.data(),
)
def test_the_device_share_is_the_models(segments, blocks, threads, data):
    segment = data.draw(st.integers(0, segments - 1))
    thread = data.draw(st.integers(0, threads - 1))
    python_ints = types.SimpleNamespace(min=min, max=max)
    with mock.patch.object(device, "cutlass", python_ints):
        got = device.share_blocks(segment, segments, blocks, threads, thread)
    assert got == share_blocks(segment, segments, blocks, threads, thread)
