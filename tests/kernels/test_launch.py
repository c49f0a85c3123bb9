import types

import torch

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.launch import WorkspaceNeed, WorkspacePool, workspace_need


def test_data_parallel_needs_no_workspace():
    need = workspace_need(GemmConfig(tile_m=128, tile_n=256), 4096, 4096, 4096, 1, 132)
    assert need == WorkspaceNeed(0, 0)


def test_split_k_needs_a_partial_tile_per_split_and_a_counter_per_unit_and_cta():
    config = GemmConfig(tile_m=128, tile_n=128, cluster_m=2, decomposition="split_k", splits=4)
    # 512 x 512: 4 x 4 tiles, 2 x 4 = 8 cluster units of 2 CTAs
    need = workspace_need(config, 512, 512, 32768, 1, 66)
    assert need == WorkspaceNeed(8 * 4 * 2 * 128 * 128, 8 * 2)
    assert need.bytes == 4 * (8 * 4 * 2 * 128 * 128 + 16)


def test_stream_k_needs_workspace_for_its_region_only():
    config = GemmConfig(tile_m=128, tile_n=128, decomposition="stream_k")
    # 1024 x 4352: 8 x 34 = 272 units on 132 SMs: two data-parallel waves, 8 stream-K units
    # shared by 32 clusters
    need = workspace_need(config, 1024, 4352, 4096, 1, 132)
    assert need.counters == 272 - 2 * 132
    assert need.partials == (32 + 8 - 1) * 128 * 128


def test_a_2cta_split_k_counts_mma_tiles_and_each_cta_holds_half_a_tile():
    config = GemmConfig(
        arch="sm_100", tile_m=256, tile_n=128, cluster_m=4, two_cta=True,
        decomposition="split_k", splits=4,
    )  # fmt: skip
    # 1024 x 512: 4 x 4 MMA tiles of 256 x 128; a cluster of 4 CTAs is 2 MMA tiles along M, so
    # 2 x 4 = 8 units of 4 CTAs, each CTA 128 x 128 of a tile's output
    need = workspace_need(config, 1024, 512, 32768, 1, 37)
    assert need == WorkspaceNeed(8 * 4 * 4 * 128 * 128, 8 * 4)


def test_eight_bit_inputs_count_k_tiles_of_128_bytes_on_hopper():
    from gemmtune.kernels import tile_k

    hopper, blackwell = GemmConfig(), GemmConfig(arch="sm_100")
    assert (tile_k(hopper, 2), tile_k(hopper, 1)) == (64, 128)
    assert (tile_k(blackwell, 2), tile_k(blackwell, 1)) == (64, 64)
    wide = GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", stage_k_bytes=256)
    assert (tile_k(wide, 2), tile_k(wide, 1)) == (128, 256)
    config = GemmConfig(tile_m=128, tile_n=128, decomposition="stream_k")
    # 1024 x 4352 x 4096: 32 k-tiles of 128 bytes for 8-bit inputs, 64 for 16-bit ones; the
    # stream-K region is the same two units' worth per cluster, but its split points differ
    sixteen = workspace_need(config, 1024, 4352, 4096, 1, 132, ab_bytes=2)
    eight = workspace_need(config, 1024, 4352, 4096, 1, 132, ab_bytes=1)
    assert eight.counters == sixteen.counters == 272 - 2 * 132
    split = GemmConfig(tile_m=128, tile_n=128, decomposition="split_k", splits=16)
    # 256 k-tiles of 16-bit, 128 of 8-bit: both take 16 splits; at k = 1024 (8 k-tiles of
    # 8-bit, 16 of 16-bit) 8-bit takes at most 8
    assert workspace_need(split, 512, 512, 1024, 1, 132, ab_bytes=1).partials == (
        16 * 8 * 128 * 128
    )
    assert workspace_need(split, 512, 512, 1024, 1, 132, ab_bytes=2).partials == (
        16 * 16 * 128 * 128
    )


def test_the_workspace_grows_to_the_larger_of_each_need_and_then_is_reused(monkeypatch):
    stream = types.SimpleNamespace(stream_id=7)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    pool, cpu = WorkspacePool(), torch.device("cpu")
    more_partials, more_counters = WorkspaceNeed(1000, 8), WorkspaceNeed(100, 64)
    pool.get(cpu, more_partials)
    partials, counters = pool.get(cpu, more_counters)
    assert partials.numel() >= 1000 and counters.numel() >= 64
    assert not counters.any()
    # alternating between the two needs no longer allocates
    assert pool.get(cpu, more_partials)[0] is partials
    assert pool.get(cpu, more_counters)[1] is counters


def test_a_launch_being_captured_gets_a_zeroed_workspace_of_its_own(monkeypatch):
    """A captured launch's workspace is not the pool's: growing the pool must not free what a
    graph replays into, and its counters are zeroed in its own capture."""
    from gemmtune.kernels import launch

    stream = types.SimpleNamespace(stream_id=7)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    pool, cpu, need = WorkspacePool(), torch.device("cpu"), WorkspaceNeed(1000, 8)
    shared = pool.get(cpu, need)
    monkeypatch.setattr(launch, "capturing", lambda device: True)
    first, second = pool.get(cpu, need), pool.get(cpu, WorkspaceNeed(5000, 64))
    assert first[0] is not shared[0] and first[1] is not shared[1]
    assert first[0] is not second[0] and second[0].numel() >= 5000
    assert not first[1].any() and not second[1].any()
    assert pool.buffers == {(cpu, 7): shared}  # the captures left the shared one as it was
    monkeypatch.setattr(launch, "capturing", lambda device: False)
    assert pool.get(cpu, need)[0] is shared[0]


def test_a_captured_launch_that_counts_nothing_fills_no_counters(monkeypatch):
    """A graph replays every fill captured with its launches: a data-parallel launch, whose
    schedule counts nothing, must not add one."""
    from gemmtune.kernels import launch

    fills = []
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **kw: fills.append(a) or zeros(*a, **kw))
    monkeypatch.setattr(launch, "capturing", lambda device: True)
    cpu = torch.device("cpu")
    data_parallel = workspace_need(GemmConfig(tile_m=64, tile_n=16), 16, 4096, 4096, 1, 132)
    assert data_parallel == WorkspaceNeed(0, 0)
    WorkspacePool().get(cpu, data_parallel)
    assert fills == []
    WorkspacePool().get(cpu, WorkspaceNeed(1000, 8))
    assert len(fills) == 1  # a split-K launch's counters are zeroed in its capture


def test_captured_launches_that_count_take_runs_of_counters_set_aside_and_fill_none(
    monkeypatch,
):
    """Counters a graph's launch takes stay its own (no other launch gets them) and are zero
    without a fill in the graph; once the runs set aside are spent, a capture fills its own."""
    from gemmtune.kernels import launch

    monkeypatch.setattr(launch, "CAPTURE_COUNTERS", 40)
    stream = types.SimpleNamespace(stream_id=7)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    pool, cpu = WorkspacePool(), torch.device("cpu")
    pool.get(cpu, WorkspaceNeed(1000, 8))  # a launch outside any capture sets them aside
    fills = []
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **kw: fills.append(a) or zeros(*a, **kw))
    monkeypatch.setattr(launch, "capturing", lambda device: True)
    runs = [pool.get(cpu, WorkspaceNeed(1000, count))[1] for count in (6, 16, 9)]
    assert fills == [] and [r.numel() for r in runs] == [6, 16, 9]
    assert not any(r.any() for r in runs)
    offsets = [r.storage_offset() for r in runs]
    assert offsets == [0, 8, 24]  # disjoint, each 16-byte aligned
    arena = pool.capture_counters[cpu].counters
    assert all(r.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr() for r in runs)
    spent = pool.get(cpu, WorkspaceNeed(1000, 8))[1]  # 33 + 8 > 40
    assert len(fills) == 1 and not spent.any()
    assert spent.untyped_storage().data_ptr() != arena.untyped_storage().data_ptr()
