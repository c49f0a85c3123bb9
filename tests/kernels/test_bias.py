"""A bias added by the kernel, on the CPU: what the signature and the problem say of it, which
binaries the rules refuse for it and how much shared memory it takes, the reference it is
checked against, and which scaled_mm calls plan for it."""

import dataclasses

import pytest
import torch

from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules
from gemmtune.measure.runner import random_bias, reference_product, torch_product

CUDA = torch.device("cuda", 0)
E4M3 = torch.float8_e4m3fn


def op(rows, cols, dtype=torch.bfloat16, column_major=False):
    stride = (1, rows) if column_major else (cols, 1)
    return Operand((rows, cols), stride, dtype, CUDA, 1 << 20)


def test_a_bias_is_part_of_the_signature_and_survives_the_swap():
    plain = KernelSignature("bf16", "bf16", "k", "k", "n")
    biased = dataclasses.replace(plain, bias=True)
    assert biased.key == plain.key + "_bias"
    assert biased.swapped().bias and biased.swapped().key.endswith("_bias")
    scaled = KernelSignature("e4m3", "bf16", "k", "k", "n", scaling="row", bias=True)
    assert scaled.key == "e4m3_bf16_ak_bk_on_2d_row_bias"
    with pytest.raises(ValueError, match="int8"):
        KernelSignature("int8", "int32", "k", "k", "n", bias=True)


def test_a_problem_with_a_bias_runs_on_the_hopper_kernel_only():
    a, b = op(300, 512), op(512, 200, column_major=True)
    hopper = GemmProblem.from_operands(a, b, arch=Arch.SM90, bias=True)
    assert hopper.supported and KernelSignature.of(hopper).bias
    assert not GemmProblem.from_operands(a, b, arch=Arch.SM90).bias
    blackwell = GemmProblem.from_operands(a, b, arch=Arch.SM100, bias=True)
    assert [r.code for r in blackwell.fallback_reasons] == ["bias"]
    int8 = op(300, 512, torch.int8), op(512, 200, torch.int8, column_major=True)
    with pytest.raises(TypeError, match="no bias"):
        GemmProblem.from_operands(*int8, arch=Arch.SM90, bias=True)


def test_the_bias_buffer_runs_along_the_output_columns_one_per_consumer_group():
    biased = KernelSignature("bf16", "bf16", "k", "k", "n", bias=True)
    coop = GemmConfig(tile_m=128, tile_n=192)
    pingpong = GemmConfig(
        tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True,
        decomposition=Decomposition.SPLIT_K, splits=2,
    )  # fmt: skip
    assert rules.vector_buffer_bytes(coop, biased) == 192 * 4
    # swapped: the tile's rows, in a buffer for split-K's shares; tiles summed whole hold
    # their rows' terms in registers
    assert rules.vector_buffer_bytes(pingpong, biased) == 2 * 64 * 4
    for decomposition in (Decomposition.DATA_PARALLEL, Decomposition.STREAM_K):
        whole = dataclasses.replace(pingpong, decomposition=decomposition, splits=1)
        assert rules.row_bias_in_registers(whole, biased)
        assert rules.vector_buffer_bytes(whole, biased) == 0
    assert not rules.row_bias_in_registers(pingpong, biased)
    assert not rules.row_bias_in_registers(dataclasses.replace(coop, swap_ab=False), biased)
    row = dataclasses.replace(biased, ab_dtype="e4m3", scaling="row")
    assert rules.vector_buffer_bytes(coop, row) == (128 + 192 + 192) * 4
    plain = dataclasses.replace(biased, bias=False)
    assert rules.vector_buffer_bytes(coop, plain) == 0
    # the buffer comes out of the A/B stages' room
    for config in (coop, pingpong):
        with_bias, without = rules.smem_plan(config, biased), rules.smem_plan(config, plain)
        assert with_bias.total_bytes <= rules.SMEM_CAPACITY
        assert with_bias.ab_stages <= without.ab_stages


def test_the_rules_refuse_the_binaries_that_spill_beside_a_bias():
    biased = KernelSignature("bf16", "bf16", "k", "k", "n", bias=True)
    plain = dataclasses.replace(biased, bias=False)
    # swapped tiles summed whole hold their rows' terms in registers: none spills with a TMA
    # store but 192-row stream-K tiles from 88 accumulators
    for tile_m, tile_n, schedule in ((128, 208, "pingpong"), (256, 208, "cooperative")):
        wide = GemmConfig(tile_m=tile_m, tile_n=tile_n, schedule=schedule, swap_ab=True)
        assert not rules.signature_reason(wide, biased)
    three_stream_k = GemmConfig(
        tile_m=192, tile_n=176, swap_ab=True, decomposition=Decomposition.STREAM_K
    )
    assert rules.signature_reason(three_stream_k, biased)
    assert not rules.signature_reason(three_stream_k, plain)
    assert not rules.signature_reason(dataclasses.replace(three_stream_k, tile_n=160), biased)
    assert not rules.signature_reason(dataclasses.replace(three_stream_k, swap_ab=False), biased)
    split_thread_stores = GemmConfig(
        tile_m=128, tile_n=256, tma_store=False, decomposition=Decomposition.SPLIT_K, splits=2
    )
    assert rules.signature_reason(split_thread_stores, biased)
    assert not rules.signature_reason(split_thread_stores, plain)
    assert not rules.signature_reason(dataclasses.replace(split_thread_stores, tile_n=176), biased)
    three_groups = GemmConfig(tile_m=192, tile_n=128, tma_store=False)  # 64 accumulators
    assert rules.signature_reason(three_groups, biased)
    assert not rules.signature_reason(dataclasses.replace(three_groups, tma_store=True), biased)
    assert not rules.signature_reason(three_groups, plain)
    # beside per-row fp8 scales, from 176 swapped with the rows' terms in registers (104 with
    # thread stores), 128 swapped split-K, 160 not swapped
    row = KernelSignature("e4m3", "bf16", "k", "k", "n", scaling="row", bias=True)
    pingpong = GemmConfig(tile_m=128, tile_n=128, schedule="pingpong")
    assert not rules.signature_reason(pingpong, row)
    swapped = dataclasses.replace(pingpong, swap_ab=True)
    assert not rules.signature_reason(dataclasses.replace(swapped, tile_n=168), row)
    assert rules.signature_reason(dataclasses.replace(swapped, tile_n=176), row)
    assert rules.signature_reason(dataclasses.replace(swapped, tma_store=False), row)  # 128
    narrow = dataclasses.replace(swapped, tile_m=64, tile_n=192, tma_store=False)  # 96
    assert not rules.signature_reason(narrow, row)
    split = dataclasses.replace(swapped, decomposition=Decomposition.SPLIT_K, splits=2)
    assert rules.signature_reason(split, row)
    assert not rules.signature_reason(dataclasses.replace(split, tile_n=112), row)
    assert rules.signature_reason(dataclasses.replace(pingpong, tile_n=160), row)
    assert not rules.signature_reason(
        dataclasses.replace(pingpong, tile_n=160), dataclasses.replace(row, bias=False)
    )


def test_the_reference_and_torchs_product_add_the_bias():
    signature = KernelSignature("bf16", "bf16", "k", "k", "n", bias=True)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(5, 64, generator=gen).bfloat16()
    b = torch.randn(64, 7, generator=gen).bfloat16()
    bias = random_bias(signature, 7, 64, "cpu", gen)
    assert bias.dtype == torch.bfloat16 and bias.shape == (7,)
    # as large as the product's elements, so a kernel that leaves it out fails the check
    assert bias.float().abs().mean() > 0.5 * (a.float() @ b.float()).abs().mean()
    assert random_bias(dataclasses.replace(signature, bias=False), 7, 64, "cpu") is None
    product = a.float() @ b.float()
    torch.testing.assert_close(reference_product(a, b, (), bias), product + bias.float())
    torch.testing.assert_close(
        torch_product(a, b, bias=bias).float(), product + bias.float(), rtol=2e-2, atol=2e-1
    )


def test_scaled_mm_plans_for_a_bias_of_the_output_type_only(monkeypatch):
    from gemmtune.api import dispatch

    made = []
    monkeypatch.setattr(
        dispatch.Dispatcher, "_kernel_plan", lambda self, problem, *a, **k: made.append(problem)
    )
    dispatcher = dispatch.Dispatcher()
    a = torch.empty(64, 128, dtype=E4M3)
    b = torch.empty(32, 128, dtype=E4M3).t()
    one = torch.ones((), dtype=torch.float32)
    good = torch.empty(32, dtype=torch.bfloat16)
    monkeypatch.setattr(dispatch.GemmProblem, "from_tensors", _problem_on_a_hopper)
    dispatcher._scaled_plan(a, b, one, one, torch.bfloat16, True, bias=good)
    assert made and made[-1].bias
    for bad in (
        torch.empty(32, dtype=torch.float16),  # not the output's type
        torch.empty(33, dtype=torch.bfloat16),  # not one per column
        torch.empty(64, dtype=torch.bfloat16)[::2],  # not contiguous
    ):
        plan = dispatcher._scaled_plan(a, b, one, one, torch.bfloat16, True, bias=bad)
        assert plan.config is None and "bias" in plan.reason
    assert len(made) == 1


def _problem_on_a_hopper(a, b, out=None, out_dtype=None, **options):
    operand = Operand.of(a, "a"), Operand.of(b, "b")
    hopper = [dataclasses.replace(o, device=CUDA) for o in operand]
    return GemmProblem.from_operands(*hopper, None, out_dtype, arch=Arch.SM90, **options)
