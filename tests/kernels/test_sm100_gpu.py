"""The Blackwell kernel on a B200 (skipped on other GPUs): tiles on one CTA and on a pair,
clusters, both epilogues, all four layouts, every output dtype and major, ragged, tiny and
batched shapes, swapped operands, split-K and stream-K, against a float32 reference (int8: the
exact int32 product; fp8: the product of the dequantized operands, scaled per tensor and per
row), outputs poisoned, a shared tile's reduction bitwise repeatable."""

import pytest
import torch
from test_sm90_fp8_gpu import check_fp8_case
from test_sm90_gpu import check_case

from gemmtune.core.device import Arch, arch_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not torch.cuda.is_available() or arch_of(0) is not Arch.SM100,
        reason="needs an sm_100 GPU (B200)",
    ),
]

# config key (raster/swizzle left out) | m x n x k x l | layout | ab -> out dtype | out major
CASES = """
sm100_128x256_c1x1_coop_tma_dp      | 1001x1528x2056x1 | tn | bf16 fp32 | n
sm100_128x128_c1x2_coop_tma_dp      | 2999x4104x1000x1 | tn | fp16 fp16 | n
sm100_64x64_c1x1_coop_st_dp         |    264x385x200x1 | tt | bf16 bf16 | m
sm100_64x192_c2x1_coop_tma_dp       |  520x4104x1000x3 | nt | bf16 bf16 | n
sm100_256x256_c2x1_2cta_coop_tma_dp | 4096x4096x4096x1 | tn | bf16 bf16 | n
sm100_256x128_c2x2_2cta_coop_st_dp  | 1000x1528x2056x2 | nn | bf16 fp32 | m
sm100_128x64_c4x1_2cta_coop_tma_dp  |         1x8x64x1 | tn | bf16 bf16 | n
sm100_128x32_c2x1_2cta_swap_coop_tma_dp | 16x4096x4096x1 | tt | bf16 bf16 | n
sm100_128x128_c1x1_coop_tma_sk4     |  520x512x32768x1 | tn | bf16 bf16 | n
sm100_64x128_c1x2_coop_st_sk16      |  256x1024x8200x1 | nt | fp16 fp16 | m
sm100_256x128_c2x1_2cta_coop_tma_sk3 | 1001x1528x2056x2 | tt | bf16 fp32 | n
sm100_256x64_c2x2_2cta_coop_st_sk5  |  1000x1000x3000x2 | nn | bf16 fp32 | m
sm100_128x128_c1x1_coop_tma_streamk | 1024x4352x4096x1 | tn | bf16 bf16 | n
sm100_128x256_c1x2_coop_st_streamk  |  1000x1528x2056x2 | nt | bf16 fp32 | m
sm100_256x128_c2x1_2cta_coop_tma_streamk | 2999x4104x1000x1 | tn | fp16 fp16 | n
sm100_256x256_c4x1_2cta_coop_st_streamk | 264x392x200x3 | nn | fp16 fp16 | m
sm100_128x64_c2x1_2cta_swap_coop_tma_streamk | 16x4096x4096x1 | tt | bf16 bf16 | n
sm100_128x256_c1x1_coop_tma_dp      | 1001x1528x2064x1 | tt | int8 int32 | n
sm100_256x128_c2x1_2cta_coop_st_sk3 |  520x512x32768x1 | tt | int8 int32 | m
sm100_256x64_c2x1_2cta_coop_tma_streamk | 1024x4352x4096x2 | tt | int8 int32 | n
"""
CASE_LINES = CASES.strip().splitlines()


@pytest.mark.parametrize("case", CASE_LINES, ids=[" ".join(c.split()) for c in CASE_LINES])
def test_kernel_matches_reference(case):
    from gemmtune.kernels.sm100 import rules

    check_case(case, rules)


# config key (raster/swizzle left out) | m x n x k | a b -> out dtype | out major | scaling
FP8_CASES = """
sm100_128x256_c1x1_coop_tma_dp      | 1001x1528x2064 | e4m3 e4m3 bf16 | n | tensor
sm100_256x128_c2x1_2cta_coop_st_dp  |  1000x1000x1008 | e4m3 e5m2 fp16 | m | row
sm100_64x32_c1x1_swap_coop_st_dp    |  16x4096x4096 | e4m3 e4m3 bf16 | n | row
sm100_128x128_c1x1_coop_tma_sk4     |  520x512x32768 | e4m3 e4m3 bf16 | n | row
sm100_256x64_c2x1_2cta_coop_st_sk3  |  264x392x2080 | e5m2 e4m3 fp32 | m | tensor
sm100_128x64_c1x1_swap_coop_tma_streamk | 33x1000x3008 | e4m3 e4m3 fp32 | n | row
sm100_256x128_c2x1_2cta_coop_tma_streamk | 1024x4352x4096 | e4m3 e4m3 bf16 | n | tensor
"""
FP8_CASE_LINES = FP8_CASES.strip().splitlines()


@pytest.mark.parametrize("case", FP8_CASE_LINES, ids=[" ".join(c.split()) for c in FP8_CASE_LINES])
def test_fp8_kernel_matches_the_dequantized_product(case):
    from gemmtune.kernels.sm100 import rules

    check_fp8_case(case, rules)
