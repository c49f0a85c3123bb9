"""How many partial sums a thread of the split-K reduction loads at once (`share_step`), from
the registers the Hopper kernel leaves it (`rules.register_split`)."""

import pytest

from gemmtune.core.config import GemmConfig, Schedule
from gemmtune.kernels.reduction import share_step
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
