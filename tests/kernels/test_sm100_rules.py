"""The Blackwell kernel's plain-Python models: the CTA pair's split of a tile, tensor memory
and shared memory."""

import pytest

from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm100 import rules


def sm100(**fields) -> GemmConfig:
    return GemmConfig(arch="sm_100", **fields)


def test_a_cta_pair_splits_a_b_and_the_output_rows():
    pair = rules.cta_share(sm100(tile_m=256, tile_n=128, cluster_m=2, two_cta=True))
    assert (pair.a_rows, pair.b_rows, pair.out_rows, pair.out_cols) == (128, 64, 128, 128)
    # the two peers cover the tile's A rows and B rows once each
    assert [pair.a_row_offset(p) for p in (0, 1)] == [0, 128]
    assert [pair.b_row_offset(p) for p in (0, 1)] == [0, 64]
    alone = rules.cta_share(sm100(tile_m=128, tile_n=128))
    assert (alone.a_rows, alone.b_rows, alone.out_rows) == (128, 128, 128)


@pytest.mark.parametrize(
    ("fields", "used", "allocated"),
    [
        ({"tile_m": 128, "tile_n": 256}, 512, 512),
        ({"tile_m": 128, "tile_n": 96}, 192, 256),  # allocations are powers of two
        ({"tile_m": 64, "tile_n": 96}, 96, 128),  # 64 rows fill the 128 lanes in half the columns
        ({"tile_m": 64, "tile_n": 32}, 32, 32),
        ({"tile_m": 256, "tile_n": 160, "cluster_m": 2, "two_cta": True}, 320, 512),
        ({"tile_m": 128, "tile_n": 64, "cluster_m": 2, "two_cta": True}, 64, 64),
    ],
)
def test_tensor_memory_holds_two_accumulator_tiles(fields, used, allocated):
    plan = rules.tmem_plan(sm100(**fields))
    assert (plan.used_columns, plan.allocated_columns) == (used, allocated)
    width = used // 2
    # tile after tile, the MMA and the epilogue alternate between the two buffers
    assert [plan.buffer_start(i) for i in range(4)] == [0, width, 0, width]


def test_a_pair_stage_holds_half_of_b_so_more_stages_fit():
    fp32 = KernelSignature(out_dtype="fp32")
    one = rules.smem_plan(sm100(tile_m=128, tile_n=256), fp32)
    pair = rules.smem_plan(sm100(tile_m=256, tile_n=256, cluster_m=2, two_cta=True), fp32)
    assert one.ab_stage_bytes == (128 + 256) * 64 * 2
    assert pair.ab_stage_bytes == (128 + 128) * 64 * 2
    assert pair.ab_stages > one.ab_stages
    assert one.epi_stage_bytes == 128 * 32 * 4  # an fp32 sub-tile of the CTA's rows
    direct = rules.smem_plan(sm100(tile_m=128, tile_n=256, tma_store=False), fp32)
    assert direct.epi_stages == 0 and direct.ab_stages >= one.ab_stages


def test_every_implemented_config_fits_tensor_and_shared_memory():
    for config in rules.implemented_configs(tuple(Decomposition)):
        plan = rules.tmem_plan(config)
        assert plan.allocated_columns <= rules.TMEM_COLUMNS
        assert plan.allocated_columns & (plan.allocated_columns - 1) == 0
        for out in ("bf16", "fp32"):
            smem = rules.smem_plan(config, KernelSignature(out_dtype=out))
            assert smem.ab_stages >= rules.MIN_AB_STAGES
            assert smem.total_bytes <= rules.SMEM_CAPACITY


def test_the_blackwell_kernel_keeps_128_byte_stages():
    assert rules.implements(sm100(tile_m=128, tile_n=32)) is None
    assert "128 bytes" in rules.implements(sm100(tile_m=128, tile_n=32, stage_k_bytes=256))
    assert all(c.stage_k_bytes == 128 for c in rules.implemented_configs())
