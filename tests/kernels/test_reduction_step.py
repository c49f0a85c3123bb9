"""How many partial sums a thread of the split-K reduction loads at once (`share_step`), and how
many floats of a partial a stream-K owner loads at once (`gather_chunk`), from the registers the
Hopper kernel leaves it (`rules.register_split`)."""

import pytest

from gemmtune.core.config import GemmConfig, Schedule
from gemmtune.kernels.reduction import MAX_CHUNK, gather_chunk, share_step
from gemmtune.kernels.sm90 import rules


def spare(config: GemmConfig) -> int:
    """What `HopperGemm` passes for an unpromoted signature."""
    consumers = rules.register_split(config)[1]
    return consumers - rules.accumulator_registers(config) - rules.CONSUMER_OVERHEAD_REGISTERS


@pytest.mark.parametrize(
    ("config", "step"),
    [
        (GemmConfig(tile_m=64, tile_n=48, schedule=Schedule.PINGPONG), (1, 8)),  # small tile
        (GemmConfig(tile_m=128, tile_n=128), (2, 8)),
        (GemmConfig(tile_m=128, tile_n=128, schedule=Schedule.PINGPONG), (2, 4)),
        (GemmConfig(tile_m=192, tile_n=128), (2, 4)),
        (GemmConfig(tile_m=128, tile_n=160, schedule=Schedule.PINGPONG), (2, 2)),
        (GemmConfig(tile_m=256, tile_n=144), (2, 2)),
    ],
)
def test_the_step_follows_the_registers_a_tile_leaves(config, step):
    assert share_step(rules.accumulator_registers(config), spare(config)) == step


def test_without_spare_registers_a_large_tile_loads_four_at_a_time():
    # promoted fp8 and the Blackwell kernel pass none
    assert share_step(64) == (2, 2)
    assert share_step(32) == (1, 8)


@pytest.mark.parametrize(
    ("config", "chunk"),
    [
        (GemmConfig(tile_m=128, tile_n=144), 36),  # 72 accumulators: 8 before, nine round trips
        (GemmConfig(tile_m=128, tile_n=144, schedule=Schedule.PINGPONG), 24),  # 144, room for 32
        (GemmConfig(tile_m=128, tile_n=128), 64),
        (GemmConfig(tile_m=128, tile_n=104), 52),
        (GemmConfig(tile_m=256, tile_n=208), 16),  # no room beyond the accumulators
    ],
)
def test_an_owner_loads_a_partial_in_the_fewest_chunks_its_registers_allow(config, chunk):
    values = rules.accumulator_registers(config)
    assert gather_chunk(values, spare(config)) == chunk


@pytest.mark.parametrize("values", [8, 16, 24, 40, 48, 56, 64, 72, 88, 104, 144, 176, 208])
@pytest.mark.parametrize("spare_registers", [0, 40, 64, 96, 200])
def test_a_chunk_divides_the_values_in_whole_vectors_within_the_limit(values, spare_registers):
    chunk = gather_chunk(values, spare_registers)
    assert values % chunk == 0 and chunk % 4 == 0
    assert chunk <= MAX_CHUNK
    # never fewer than without spare registers (promoted fp8, the Blackwell kernel)
    assert chunk >= gather_chunk(values)
