"""fp8 problems and signatures on the CPU: which calls our kernels serve, how a signature names
B's type, the scaling and promotion, what a swapped binary is built for, and torch's answer
where it serves."""

import pytest
import torch

from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand, fallback_matmul, scaled_reference
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
CUDA = torch.device("cuda", 0)


def op(rows, cols, dtype=E4M3, column_major=False):
    stride = (1, rows) if column_major else (cols, 1)
    return Operand((rows, cols), stride, dtype, CUDA, 1 << 20)


def problem(a, b, out_dtype=None, arch=Arch.SM90, **kw):
    return GemmProblem.from_operands(a, b, None, out_dtype, arch=arch, **kw)


def test_fp8_with_k_major_operands_is_served_per_tensor_by_default():
    p = problem(op(64, 128), op(128, 32, column_major=True))
    assert p.supported and p.scaling == "tensor" and not p.promoted
    assert p.out_dtype == torch.bfloat16  # fp8 is never written: bf16 by default
    assert problem(op(64, 128), op(128, 32, E5M2, True), scaling="row").supported


def test_fp8_is_copied_where_8_bit_mmas_cannot_read_it_and_falls_back_where_no_kernel_runs():
    row_major_b = problem(op(64, 128), op(128, 32))
    assert row_major_b.supported and row_major_b.copied == ("b",)
    b = op(128, 32, column_major=True)
    assert problem(op(64, 128), b, arch=Arch.SM100).supported  # fast accumulation
    promoted_on_b200 = problem(op(64, 128), b, arch=Arch.SM100, promoted=True)
    assert [r.code for r in promoted_on_b200.fallback_reasons] == ["dtype"]
    assert [r.code for r in problem(op(64, 128), b, arch=Arch.OTHER).fallback_reasons] == ["arch"]


def test_wrong_fp8_calls_raise():
    a, b = op(64, 128), op(128, 32, column_major=True)
    with pytest.raises(TypeError, match="two fp8 types"):
        problem(a, op(128, 32, torch.bfloat16, True))
    with pytest.raises(TypeError, match="out_dtype"):
        problem(a, b, out_dtype=torch.float64)
    with pytest.raises(ValueError, match="scaling 'block'"):
        problem(a, b, scaling="block")
    with pytest.raises(ValueError, match="for fp8 inputs"):
        problem(op(64, 128, torch.bfloat16), op(128, 32, torch.bfloat16), scaling="row")
    with pytest.raises(ValueError, match="for fp8 inputs"):
        problem(op(64, 128, torch.bfloat16), op(128, 32, torch.bfloat16), promoted=True)


def test_signature_names_types_scaling_and_promotion_and_swaps_the_types():
    p = problem(op(64, 128), op(128, 32, E5M2, True), scaling="row", promoted=True)
    sig = KernelSignature.of(p)
    assert sig.key == "e4m3xe5m2_bf16_ak_bk_on_2d_row_promoted"
    swapped = sig.swapped()
    assert (swapped.ab_dtype, swapped.b_input, swapped.out_major) == ("e5m2", "e4m3", "m")
    assert swapped.swapped() == sig
    same = KernelSignature.of(problem(op(64, 128), op(128, 32, column_major=True)))
    assert same.key == "e4m3_bf16_ak_bk_on_2d_tensor" and same.swapped().b_dtype == ""


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"ab_dtype": "e4m3", "out_dtype": "bf16", "b_major": "k"}, "scaling"),
        ({"ab_dtype": "bf16", "scaling": "tensor"}, "scaling"),
        ({"ab_dtype": "e4m3", "b_dtype": "e4m3", "scaling": "row", "b_major": "k"}, "b_dtype"),
        ({"ab_dtype": "bf16", "b_dtype": "fp16"}, "b_dtype"),
        ({"ab_dtype": "int8", "out_dtype": "int32", "b_major": "k", "promoted": True}, "fp8"),
        ({"ab_dtype": "e4m3", "scaling": "row", "b_major": "n"}, "K-major"),
    ],
)
def test_invalid_signatures_raise(fields, match):
    with pytest.raises(ValueError, match=match):
        KernelSignature(**fields)


def test_promoted_binaries_need_room_for_two_register_tiles():
    sig = KernelSignature("e4m3", "bf16", "k", "k", scaling="tensor", promoted=True)
    fast = KernelSignature("e4m3", "bf16", "k", "k", scaling="tensor")
    wide = GemmConfig(tile_m=128, tile_n=256)  # 128 accumulator registers per thread
    assert rules.signature_reason(wide, fast) is None
    assert "promoted" in rules.signature_reason(wide, sig)
    assert rules.signature_reason(GemmConfig(tile_m=128, tile_n=128), sig) is None


def test_an_unserved_fp8_product_is_the_float32_product_rounded_once():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(33, 64, generator=gen).to(E4M3)
    b = torch.randn(64, 17, generator=gen).to(E5M2)
    got = fallback_matmul(a, b)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, torch.matmul(a.float(), b.float()).to(torch.bfloat16))
    out = torch.empty(33, 17)
    assert fallback_matmul(a, b, out) is out and torch.equal(
        out, torch.matmul(a.float(), b.float())
    )


def test_scaled_reference_scales_per_tensor_and_per_row():
    a = torch.ones(3, 4).to(E4M3)
    b = torch.ones(4, 2).to(E4M3)
    per_tensor = scaled_reference(a, b, torch.tensor(0.5), torch.tensor(2.0))
    assert torch.equal(per_tensor, torch.full((3, 2), 4.0))
    rows, cols = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[1.0, 10.0]])
    assert torch.equal(scaled_reference(a, b, rows, cols), 4 * rows * cols)


def test_an_fp8_problem_by_shape_for_tuning_ahead():
    p = GemmProblem.of_shape(
        16, 8192, 8192, dtype=E4M3, b_dtype=E5M2, layout="tt", scaling="row", promoted=True,
        device="cuda", arch=Arch.SM90,
    )  # fmt: skip
    assert p.supported and KernelSignature.of(p).key == "e4m3xe5m2_bf16_ak_bk_on_2d_row_promoted"
