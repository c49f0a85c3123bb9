"""Which of the Hopper kernel's operands a constant b makes it load before the kernel ahead of
it finishes: torch's b, which a swapped binary reads as its A, and only in a dependent launch
(a plain launch starts after that kernel anyway)."""

import pytest

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90.kernel import HopperGemm

DIRECT = GemmConfig(tile_m=128, tile_n=128, cluster_m=2)
SWAPPED = GemmConfig(tile_m=64, tile_n=16, swap_ab=True, schedule="pingpong", stage_k_bytes=256)


@pytest.mark.parametrize(
    ("config", "constant_b", "dependent_launch", "early"),
    [
        (DIRECT, True, True, "b"),
        (SWAPPED, True, True, "a"),
        (DIRECT, False, True, None),
        (SWAPPED, False, True, None),
        (DIRECT, True, False, None),
    ],
)
def test_the_early_operand_is_torchs_b(config, constant_b, dependent_launch, early):
    signature = KernelSignature(constant_b=constant_b)
    built_for = signature.swapped() if config.swap_ab else signature  # as `compile_gemm` builds
    gemm = HopperGemm(config, built_for, dependent_launch=dependent_launch)
    assert gemm.early_operand == early


def test_a_constant_b_is_a_binary_of_its_own():
    plain, constant = KernelSignature(), KernelSignature(constant_b=True)
    assert constant.key == plain.key + "_constb"
    assert constant.swapped().constant_b
