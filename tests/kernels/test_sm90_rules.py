"""The Hopper kernel's rules (plain Python): warpgroups, registers, shared memory, validity."""

import dataclasses

import pytest
import test_bias_gpu as bias_cases
import test_sm90_fp8_gpu as fp8_cases
from test_sm90_gpu import CASE_LINES, parse_case

from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.dtypes import torch_dtype
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules

#: A promoted fp8 product's signature: e4m3 per tensor into bf16
PROMOTED = KernelSignature(
    ab_dtype="e4m3", out_dtype="bf16", b_major="k", scaling="tensor", promoted=True
)

WG = rules.THREADS_PER_WARPGROUP


@pytest.mark.parametrize(
    ("config", "consumers", "rows_per_pass"),
    [
        (GemmConfig(tile_m=192, tile_n=192), 3, 192),
        (GemmConfig(tile_m=256, tile_n=128), 2, 128),
        (GemmConfig(tile_m=128, tile_n=256), 2, 128),
        (GemmConfig(tile_m=128, tile_n=128, schedule="pingpong"), 2, 64),
    ],
)
def test_consumer_warpgroups_split_the_rows(config, consumers, rows_per_pass):
    assert rules.consumer_warpgroups(config) == consumers
    assert rules.mma_tile_m(config) == rows_per_pass
    assert rules.epi_tile(config)[0] == rows_per_pass


def test_register_split_fits_the_register_file():
    for config in rules.implemented_configs():
        producer, consumer = rules.register_split(config)
        consumers = rules.consumer_warpgroups(config)
        assert producer % 8 == 0 and consumer % 8 == 0 and 24 <= producer <= consumer <= 256
        assert (producer + consumers * consumer) * WG <= rules.REGISTER_FILE
        assert rules.accumulator_registers(config) <= consumer - rules.CONSUMER_OVERHEAD_REGISTERS
    # promoted fp8: every binary its signatures accept holds all its register tiles
    for config in rules.implemented_configs():
        if rules.signature_reason(config, PROMOTED) is not None:
            continue
        tiles = rules.promoted_register_tiles(config)
        producer, consumer = rules.register_split(config, tiles)
        consumers = rules.consumer_warpgroups(config)
        assert (producer + consumers * consumer) * WG <= rules.REGISTER_FILE
        # the lean overhead only beside TMA stores without split-K (the others spill there)
        lean = config.tma_store and config.decomposition is not Decomposition.SPLIT_K
        overhead = rules.CONSUMER_OVERHEAD_REGISTERS
        if lean:
            overhead = rules.LEAN_PROMOTED_OVERHEAD_REGISTERS
        assert tiles * rules.accumulator_registers(config) <= consumer - overhead
    # the consumers get all but the producer's share, rounded down to a multiple of 8
    assert rules.register_split(GemmConfig(tile_m=256, tile_n=128)) == (40, 232)
    assert rules.register_split(GemmConfig(tile_m=192, tile_n=192)) == (24, 160)


def test_192_row_tiles_stop_where_one_wgmma_outgrows_a_512_thread_launch():
    assert rules.implements(GemmConfig(tile_m=192, tile_n=192)) is None
    why = rules.implements(GemmConfig(tile_m=192, tile_n=224))
    assert why is not None and "m64n224 WGMMA" in why and "512 threads" in why
    # two consumer warpgroups (384 threads) leave room for the widest WGMMA
    assert rules.implements(GemmConfig(tile_m=128, tile_n=256)) is None
    assert "tile_m" in rules.implements(GemmConfig(tile_m=192, tile_n=128, schedule="pingpong"))


def test_every_plan_fits_shared_memory():
    for config in rules.implemented_configs():
        for out in ("bf16", "fp32"):
            plan = rules.smem_plan(config, KernelSignature(out_dtype=out))
            assert plan.total_bytes <= rules.SMEM_CAPACITY
            assert plan.ab_stages >= rules.MIN_AB_STAGES
            # both epilogues stage sub-tiles in shared memory: the same plan
            other = dataclasses.replace(config, tma_store=not config.tma_store)
            assert rules.smem_plan(other, KernelSignature(out_dtype=out)) == plan
            epi_m, epi_n = rules.epi_tile(config)
            subtiles = (config.tile_m // epi_m) * (config.tile_n // epi_n)
            assert 2 <= plan.epi_stages <= 2 * subtiles
            # the buffers take what the A/B stages leave, short of one more
            left = rules.SMEM_CAPACITY - plan.total_bytes
            assert plan.epi_stages == 2 * subtiles or left < plan.epi_stage_bytes
            # two groups leave a buffer to a store still in flight
            assert plan.epi_group == 1 or 2 * plan.epi_group < plan.epi_stages


def test_epilogue_gives_up_buffers_only_for_an_ab_stage():
    sig = KernelSignature()
    # 192x192: four 12 KB buffers leave 3 A/B stages of 48 KB, two leave 4
    plan = rules.smem_plan(GemmConfig(tile_m=192, tile_n=192), sig)
    assert (plan.ab_stages, plan.epi_stages) == (4, 2)
    # 256x128: two buffers would not buy a fifth stage, so it keeps four
    plan = rules.smem_plan(GemmConfig(tile_m=256, tile_n=128), sig)
    assert (plan.ab_stages, plan.epi_stages) == (4, 4)
    # 256x208: three A/B stages of 58 KB leave 52 KB, thirteen 4 KB buffers, stored six at most
    # per barrier; its stream-K build spills with more than four, one at a time
    plan = rules.smem_plan(GemmConfig(tile_m=256, tile_n=208), sig)
    assert (plan.ab_stages, plan.epi_stages, plan.epi_group) == (3, 13, 6)
    plan = rules.smem_plan(GemmConfig(tile_m=256, tile_n=208, decomposition="stream_k"), sig)
    assert (plan.ab_stages, plan.epi_stages, plan.epi_group) == (3, 4, 1)
    assert rules.smem_plan(GemmConfig(tile_m=256, tile_n=128, tma_store=False), sig).ab_stages == 4


def test_split_k_keeps_registers_for_its_reduction():
    wide = GemmConfig(tile_m=256, tile_n=192, decomposition="split_k", splits=2)
    assert "spills" in rules.implements(wide)
    assert rules.implements(GemmConfig(tile_m=256, tile_n=192, decomposition="stream_k")) is None
    assert rules.implements(dataclasses.replace(wide, tile_n=160)) is None


def test_batched_signatures_refuse_the_192_row_tiles_that_spill():
    batched, flat = KernelSignature(batched=True), KernelSignature()
    for tile_n in (144, 160):
        config = GemmConfig(tile_m=192, tile_n=tile_n)
        assert "batch" in rules.signature_reason(config, batched)
        assert rules.signature_reason(config, flat) is None
    for tile_n in (128, 192):  # compiled clean batched
        assert rules.signature_reason(GemmConfig(tile_m=192, tile_n=tile_n), batched) is None


def test_192_row_thread_stores_to_a_16_bit_m_major_output_are_served():
    """Three warpgroups store two columns of 192 rows at a time (`store_thread_shape`), which
    a 16-bit M-major buffer's 64-row swizzle blocks divide; the compile test builds them."""
    m_major = KernelSignature("bf16", "bf16", "k", "n", out_major="m")
    stores = GemmConfig(tile_m=192, tile_n=160, tma_store=False)
    split_k = dataclasses.replace(stores, decomposition=Decomposition.SPLIT_K, splits=2)
    stream_k = dataclasses.replace(stores, decomposition=Decomposition.STREAM_K)
    for config in (stores, split_k, stream_k):
        assert rules.signature_reason(config, m_major) is None
    # swapped, the kernel's output is M-major where the problem's is N-major
    n_major = KernelSignature("bf16", "bf16", "k", "n")
    assert rules.signature_reason(dataclasses.replace(stores, swap_ab=True), n_major) is None
    # what still spills there: 192 accumulators per thread
    wide = GemmConfig(tile_m=128, tile_n=192, schedule="pingpong", tma_store=False)
    assert "spill" in rules.signature_reason(wide, m_major)


def test_thread_stores_are_refused_from_each_outputs_register_limit():
    """Per-row fp8 from 144 accumulators, 4-byte outputs from 160, other M-major outputs from
    192 (what spilled when compiled); N-major 16-bit outputs keep `implements`'s limit."""
    row = KernelSignature("e4m3", "bf16", "k", "k", "n", scaling="row")
    fp32 = KernelSignature("bf16", "fp32", "k", "n")
    int32 = KernelSignature("int8", "int32", "k", "k", "m")
    m_major = KernelSignature("bf16", "bf16", "k", "n", out_major="m")
    n_major = KernelSignature("bf16", "bf16", "k", "n")
    assert [rules.thread_store_register_limit(s) for s in (row, fp32, int32, m_major)] == [
        144,
        160,
        160,
        192,
    ]
    assert rules.thread_store_register_limit(n_major) is None
    for signature in (row, fp32, int32, m_major):
        limit = rules.thread_store_register_limit(signature)
        for tile_n, schedule in ((128, "pingpong"), (144, "pingpong"), (160, "pingpong")):
            stores = GemmConfig(tile_m=128, tile_n=tile_n, schedule=schedule, tma_store=False)
            regs = rules.accumulator_registers(stores)
            reason = rules.signature_reason(stores, signature)
            assert (reason is not None) == (regs >= limit), (signature.key, stores.key)
            # a TMA store holds no accumulators beside the stores
            tma = dataclasses.replace(stores, tma_store=True)
            assert rules.signature_reason(tma, signature) is None
    wide = GemmConfig(tile_m=256, tile_n=176, tma_store=False)  # 176 per thread
    assert rules.signature_reason(wide, n_major) is None
    assert "spill" in rules.signature_reason(wide, fp32)


def test_promoted_fp8_keeps_a_spare_tile_of_partial_sums_where_three_fit():
    from gemmtune.core.config import GemmConfig
    from gemmtune.kernels.sm90 import rules as sm90

    assert sm90.promotion_buffers(GemmConfig(tile_m=128, tile_n=128)) == 2  # 3 x 64 <= 200
    assert sm90.promotion_buffers(GemmConfig(tile_m=64, tile_n=16, schedule="pingpong")) == 2
    assert sm90.promotion_buffers(GemmConfig(tile_m=128, tile_n=192)) == 1  # 3 x 96 > 200
    # 3 x 72 fits 240 registers beside TMA stores without split-K only
    wave = GemmConfig(tile_m=128, tile_n=144, cluster_m=2)
    assert sm90.promotion_buffers(wave) == 2
    assert sm90.register_split(wave, sm90.promoted_register_tiles(wave)) == (24, 240)
    assert sm90.promotion_buffers(dataclasses.replace(wave, tile_m=64, schedule="pingpong")) == 2
    assert sm90.promotion_buffers(dataclasses.replace(wave, tma_store=False)) == 1
    split = dataclasses.replace(wave, decomposition="split_k", splits=2)
    assert sm90.promotion_buffers(split) == 1
    # two-step stages: two pairs where five tiles fit (5 x 8), else one pair (5 x 48 > 208)
    wide = GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True, stage_k_bytes=256)
    assert sm90.promotion_buffers(wide) == 4
    assert sm90.promotion_buffers(dataclasses.replace(wide, tile_m=128, tile_n=48)) == 2


def test_promoted_tiles_of_up_to_104_accumulators_take_registers_from_the_producer():
    wide = GemmConfig(tile_m=128, tile_n=208)  # 104 accumulators and 104 partial sums
    assert rules.promoted_register_tiles(wide) == 2
    assert rules.register_split(wide) == (40, 232)
    assert rules.register_split(wide, 2) == (24, 240)
    assert rules.signature_reason(wide, PROMOTED) is None
    assert (
        rules.signature_reason(GemmConfig(tile_m=64, tile_n=208, schedule="pingpong"), PROMOTED)
        is None
    )
    # 2 x 112 registers are more than the 208 a consumer of 240 leaves for them
    assert "2 x 112" in rules.signature_reason(GemmConfig(tile_m=128, tile_n=224), PROMOTED)
    # a tile of three register tiles under 208 leaves the producer its 40
    assert rules.register_split(GemmConfig(tile_m=128, tile_n=128), 3) == (40, 232)


def test_wide_stages_are_for_narrow_tiles_and_hold_twice_the_bytes():
    narrow = GemmConfig(tile_m=128, tile_n=16, swap_ab=True)
    wide = dataclasses.replace(narrow, stage_k_bytes=256)
    assert rules.implements(wide) is None
    bf16 = KernelSignature()
    plan, wide_plan = rules.smem_plan(narrow, bf16), rules.smem_plan(wide, bf16)
    assert wide_plan.ab_stage_bytes == 2 * plan.ab_stage_bytes == 144 * 256
    assert wide_plan.ab_stages == 6 and plan.ab_stages == 12
    assert rules.tile_k(2, 256) == 128 and rules.tile_k(1, 256) == 256
    # a 64-wide tile is bound by its MMAs or its L2 traffic: no wide stages
    assert "narrow tiles" in rules.implements(GemmConfig(tile_n=64, stage_k_bytes=256))
    # 192 + 48 rows of 256 bytes leave fewer than four stages
    assert "stages of 256 bytes" in rules.implements(
        GemmConfig(tile_m=192, tile_n=48, stage_k_bytes=256)
    )
    implemented = rules.implemented_configs()
    assert wide in [dataclasses.replace(c, swap_ab=True) for c in implemented]
    assert all(c.tile_n in rules.NARROW_TILE_NS for c in implemented if c.stage_k_bytes == 256)


def test_promoted_fp8_adds_two_steps_of_a_wide_stage():
    wide = GemmConfig(tile_m=128, tile_n=32, stage_k_bytes=256)
    narrow = dataclasses.replace(wide, stage_k_bytes=128)
    assert rules.signature_reason(wide, PROMOTED) is None
    assert rules.signature_reason(narrow, PROMOTED) is None
    # the tensor cores' sums span 128 elements either way: one step per 128-byte stage
    assert rules.promotion_steps(wide) == 2 and rules.promotion_steps(narrow) == 1
    assert rules.tile_k(1, wide.stage_k_bytes) == 256 and rules.tile_k(1) == 128


def test_per_row_scales_take_their_buffers_from_the_ab_stages():
    row = KernelSignature("e4m3", "bf16", "k", "k", "n", scaling="row")
    tensor = KernelSignature("e4m3", "bf16", "k", "k", "n", scaling="tensor")
    for config in rules.implemented_configs():
        plan = rules.smem_plan(config, row)
        groups = 1 if config.schedule.value == "cooperative" else 2
        assert plan.vector_bytes == groups * (config.tile_m + config.tile_n) * 4
        assert plan.total_bytes <= rules.SMEM_CAPACITY
        assert plan.ab_stages >= rules.MIN_AB_STAGES
        assert rules.smem_plan(config, tensor).vector_bytes == 0
    # 128x256 ping-pong at 128-byte stages: 48 KB a stage, four of them and 3 KB of scales
    # leave the epilogue's buffers what they had per tensor
    config = GemmConfig(tile_m=128, tile_n=256, schedule="pingpong")
    assert rules.smem_plan(config, row).ab_stages == rules.smem_plan(config, tensor).ab_stages


@pytest.mark.parametrize("case", CASE_LINES)
def test_every_gpu_case_is_one_the_rules_serve(case):
    """A case of the GPU table whose config the rules stop serving would fail only on a GPU
    machine; here it fails wherever the tests run."""
    config, (m, n, k, l), layout, ab, out_dtype, out_major = parse_case(case)
    problem = GemmProblem.of_shape(
        m,
        n,
        k,
        l if l > 1 else None,
        dtype=torch_dtype(ab),
        out_dtype=torch_dtype(out_dtype),
        layout=layout,
        out_major=out_major,
        device="cuda:0",
        arch=Arch.SM90,
    )
    assert rules.serves(config, problem) is None


def case_problem(parsed: tuple, bias: bool = False) -> tuple[GemmConfig, GemmProblem]:
    """The config and problem of a case of an fp8 or bias GPU test (their `parse_case`)."""
    config, (m, n, k), a_name, b_name, out_name, out_major, scaling, promoted = parsed
    problem = GemmProblem.of_shape(
        m,
        n,
        k,
        dtype=torch_dtype(a_name),
        b_dtype=torch_dtype(b_name),
        out_dtype=torch_dtype(out_name),
        layout="tt",
        out_major=out_major,
        device="cuda:0",
        arch=Arch.SM90,
        scaling=scaling or None,
        promoted=promoted,
        bias=bias,
    )
    return config, problem


@pytest.mark.parametrize("case", fp8_cases.CASE_LINES)
def test_every_fp8_gpu_case_is_one_the_rules_serve(case):
    config, problem = case_problem(fp8_cases.parse_case(case))
    assert rules.serves(config, problem) is None


@pytest.mark.parametrize("case", bias_cases.CASE_LINES)
def test_every_bias_gpu_case_is_one_the_rules_serve(case):
    config, problem = case_problem(bias_cases.parse_case(case), bias=True)
    assert problem.bias and rules.serves(config, problem) is None


def test_widths_of_an_odd_number_of_8_column_blocks_serve_all_inputs_but_int8():
    fp8 = KernelSignature("e4m3", "bf16", "k", "k", "n", False, scaling="tensor")
    int8 = KernelSignature("int8", "int32", "k", "k", "n", False)
    fp16_mn_major_b = KernelSignature("fp16", "fp16", "k", "n", "n", False)
    for width in rules.ODD_EIGHT_TILE_NS:
        assert width % 16 == 8
        config = GemmConfig(tile_m=128, tile_n=width, schedule="pingpong", swap_ab=True)
        assert rules.implements(config) is None
        assert rules.epi_tile(config) == (64, 8)
        for served in (fp8, KernelSignature(), fp16_mn_major_b):
            assert rules.signature_reason(config, served) is None
        assert "int8 WGMMAs" in rules.signature_reason(config, int8)
        assert "TMA" in rules.implements(dataclasses.replace(config, tma_store=False))
        streamk = dataclasses.replace(config, decomposition=Decomposition.STREAM_K)
        assert "stream-K" in rules.implements(streamk)
    # a width of an even number of blocks keeps its 16- or 32-column sub-tiles
    assert rules.epi_tile(GemmConfig(tile_m=128, tile_n=80, schedule="pingpong")) == (64, 16)
    assert rules.epi_tile(GemmConfig(tile_m=128, tile_n=96, schedule="pingpong")) == (64, 32)
