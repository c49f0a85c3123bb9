"""The Hopper kernel's fp8 products on the GPU: e4m3 and e5m2 (mixed too), scaled per tensor
and per row and column, accumulated on the tensor cores or promoted into fp32 per k-tile,
every decomposition, swapped operands, ragged and tiny shapes, every output dtype and major,
against the float32 product of the dequantized operands; and no worse than torch._scaled_mm
accumulating the same way."""

import pytest
import torch

from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch, arch_of
from gemmtune.core.dtypes import torch_dtype
from gemmtune.core.problem import GemmProblem, scaled_reference
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.runner import random_scales, random_tensor
from gemmtune.measure.verify import poison, relative_error, tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        torch.cuda.is_available() and arch_of(0) is not Arch.SM90,
        reason="fp8 runs on the Hopper kernel (an sm_90 GPU)",
    ),
]

# config key (raster/swizzle left out) | m x n x k | a b -> out dtype | out major | scaling
CASES = """
sm90_128x128_c1x1_coop_tma_dp       | 4096x4096x4096 | e4m3 e4m3 bf16 | n | tensor
sm90_128x256_c2x1_coop_tma_dp       | 1001x1528x2064 | e4m3 e4m3 bf16 | n | row
sm90_256x128_c1x2_coop_st_dp        |  1000x1000x1008 | e4m3 e5m2 fp16 | m | row
sm90_64x256_c1x1_pp_tma_dp          |  264x392x208 | e5m2 e4m3 fp32 | n | tensor
sm90_128x128_c2x1_pp_st_dp          |  264x392x208 | e4m3 e4m3 fp32 | m | row
sm90_128x32_c1x1_swap_pp_tma_dp     |  16x4096x4096 | e4m3 e4m3 bf16 | n | row
sm90_64x16_c2x1_swap_pp_tma_dp      |   1x8192x1024 | e4m3 e4m3 bf16 | n | tensor
sm90_128x128_c1x1_coop_tma_sk4      |  520x512x32768 | e4m3 e4m3 bf16 | n | row
sm90_128x64_c1x1_swap_coop_st_sk3   |  16x4096x8192 | e4m3 e5m2 bf16 | m | row
sm90_128x256_c2x1_coop_tma_streamk  | 1024x4352x4096 | e4m3 e4m3 bf16 | n | row
sm90_64x128_c1x1_pp_st_streamk      | 1000x1528x2064 | e4m3 e4m3 fp32 | m | tensor
sm90_128x144_c2x1_coop_tma_streamk  | 1000x4352x4096 | e4m3 e4m3 bf16 | n | tensor
sm90_128x144_c2x1_pp_tma_streamk    | 1024x4352x4096 | e4m3 e4m3 bf16 | n | row
sm90_128x64_c1x1_swap_pp_st_streamk |  33x1000x3008 | e5m2 e4m3 fp16 | n | row
sm90_128x128_c1x1_coop_tma_dp       | 2048x2048x8192 | e4m3 e4m3 bf16 | n | tensor promoted
sm90_64x192_c2x1_pp_st_dp           |  1000x1528x2064 | e4m3 e5m2 fp32 | m | row promoted
sm90_128x128_c1x1_coop_tma_sk4      |  520x512x32768 | e4m3 e4m3 bf16 | n | row promoted
sm90_128x64_c1x1_swap_pp_st_streamk |  33x1000x3008 | e4m3 e4m3 fp32 | n | tensor promoted
sm90_128x32_c1x1_swap_pp_tma_k256_dp |  16x4096x4096 | e4m3 e4m3 bf16 | n | tensor
sm90_64x16_c1x1_swap_pp_st_k256_sk2 |   3x6144x4112 | e4m3 e5m2 fp16 | n | row
sm90_64x16_c4x1_swap_pp_tma_k256_dp |  8x4096x14336 | e4m3 e4m3 bf16 | n | tensor promoted
sm90_128x32_c1x1_swap_coop_st_k256_sk4 | 5x6144x8208 | e4m3 e5m2 fp32 | n | row promoted
sm90_64x48_c1x1_pp_tma_k256_streamk |  40x2048x4112 | e4m3 e4m3 fp32 | m | tensor promoted
sm90_128x208_c2x1_coop_tma_dp       | 1001x1528x2064 | e4m3 e4m3 bf16 | n | tensor promoted
sm90_128x144_c2x1_coop_tma_dp       | 1001x4352x4112 | e4m3 e4m3 bf16 | n | tensor promoted
sm90_64x144_c1x2_pp_tma_dp          | 1000x1001x3008 | e4m3 e5m2 fp32 | m | row promoted
sm90_128x144_c1x1_swap_coop_tma_dp  |  200x2304x8192 | e4m3 e4m3 fp16 | n | row promoted
sm90_128x48_c1x1_swap_pp_tma_k256_dp |  16x6144x4112 | e4m3 e4m3 bf16 | n | tensor promoted
sm90_64x16_c1x1_swap_pp_tma_k256_dp |   8x1024x208 | e4m3 e4m3 bf16 | n | row promoted
sm90_64x208_c1x1_swap_pp_st_dp      |  264x392x208 | e4m3 e5m2 fp32 | m | row promoted
sm90_128x208_c1x1_coop_tma_streamk  | 1537x1000x3008 | e4m3 e4m3 fp16 | n | row promoted
sm90_256x88_c2x1_swap_coop_tma_dp   |  777x3584x3584 | e4m3 e4m3 bf16 | n | tensor
sm90_128x104_c4x1_swap_pp_tma_dp    |  300x9216x3072 | e4m3 e5m2 fp16 | n | row
sm90_128x200_c1x1_swap_coop_tma_dp  | 200x14336x4096 | e4m3 e4m3 bf16 | n | tensor promoted
sm90_64x168_c1x2_swap_pp_tma_sk4    |  333x4096x4096 | e4m3 e4m3 fp32 | n | tensor
sm90_128x152_c2x1_coop_tma_dp       | 1000x1528x2064 | e4m3 e4m3 bf16 | m | row
sm90_128x88_c1x1_pp_tma_dp          |    264x392x208 | e4m3 e4m3 bf16 | n | tensor
sm90_64x56_c1x2_swap_pp_tma_dp      | 100x3584x18944 | e4m3 e4m3 bf16 | n | tensor
sm90_128x56_c2x1_swap_pp_tma_sk2    |   97x4096x4096 | e4m3 e5m2 fp32 | n | row promoted
"""


def parse_case(line):
    key, shape, dtypes, out_major, scaling = (part.strip() for part in line.split("|"))
    a_dtype, b_dtype, out_dtype = dtypes.split()
    m, n, k = (int(x) for x in shape.split("x"))
    config = GemmConfig.from_key(key + "_rm_s1")
    scaling, _, promoted = scaling.partition(" ")
    return config, (m, n, k), a_dtype, b_dtype, out_dtype, out_major, scaling, bool(promoted)


CASE_LINES = CASES.strip().splitlines()


@pytest.mark.parametrize("case", CASE_LINES, ids=[" ".join(c.split()) for c in CASE_LINES])
def test_fp8_kernel_matches_the_dequantized_product(case):
    from gemmtune.kernels.sm90 import rules

    check_fp8_case(case, rules)


def check_fp8_case(case: str, rules) -> None:
    """Run one fp8 case line (`CASES`' format) on the kernel `rules` serves, against the
    float32 product of the dequantized operands and no worse than torch._scaled_mm."""
    from gemmtune.kernels.build import compile_gemm
    from gemmtune.kernels.launch import launch

    config, (m, n, k), a_name, b_name, out_name, out_major, scaling, promoted = parse_case(case)
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = random_tensor((m, k), torch_dtype(a_name), "cuda", gen)
    b = random_tensor((n, k), torch_dtype(b_name), "cuda", gen).t()  # K-major, as 8-bit needs
    out_dtype = torch_dtype(out_name)
    out = torch.empty((n, m) if out_major == "m" else (m, n), device="cuda", dtype=out_dtype)
    out = out.t() if out_major == "m" else out
    poison(out)
    problem = GemmProblem.from_tensors(a, b, out, scaling=scaling, promoted=promoted)
    assert rules.serves(config, problem) is None
    signature = KernelSignature.of(problem)
    scales = random_scales(signature, m, n, "cuda", gen)
    kernel = compile_gemm(config, signature)
    launch(kernel, a, b, out, config, scales=scales)
    torch.cuda.synchronize()
    assert not out.isnan().any(), "some outputs were never written"
    reference = scaled_reference(a, b, *scales)
    err = relative_error(out, reference)
    assert err <= tolerance(out_dtype, a.dtype), err
    if a.dtype == b.dtype == torch.float8_e4m3fn and k % 16 == 0 and n % 16 == 0:
        theirs = torch._scaled_mm(
            a, b, *scales, out_dtype=torch.bfloat16 if scaling == "row" else out_dtype,
            use_fast_accum=not promoted,
        )  # fmt: skip
        their_err = relative_error(theirs, reference)
        print(f"{case}: ours {err:.2e}, torch._scaled_mm {their_err:.2e}")
        assert err <= 2 * their_err + tolerance(out_dtype)


def test_every_row_and_column_gets_its_own_scale():
    """Row scales 1..300 and column scales 0.5..2: every row and every column of the output is
    within tolerance of its own scaled product (an unscaled or misplaced scale is far off)."""
    from gemmtune.kernels.build import compile_gemm
    from gemmtune.kernels.launch import launch

    config = GemmConfig(tile_m=128, tile_n=128)
    a = random_tensor((300, 512), torch.float8_e4m3fn)
    b = random_tensor((200, 512), torch.float8_e4m3fn).t()
    problem = GemmProblem.from_tensors(a, b, None, torch.float32, scaling="row")
    kernel = compile_gemm(config, KernelSignature.of(problem))
    scale_a = torch.arange(1, 301, device="cuda", dtype=torch.float32).reshape(300, 1)
    scale_b = torch.linspace(0.5, 2.0, 200, device="cuda").reshape(1, 200)
    out = torch.empty(300, 200, device="cuda")
    poison(out)
    launch(kernel, a, b, out, config, scales=(scale_a, scale_b))
    expected = torch.matmul(a.float(), b.float()) * scale_a * scale_b
    for dim in (0, 1):
        errors = (out - expected).norm(dim=dim) / expected.norm(dim=dim)
        assert errors.max() <= tolerance(torch.float32, a.dtype), (dim, errors.max())


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(tile_m=128, tile_n=128),
        # 72 accumulators and two tiles of partial sums in 240 registers
        GemmConfig(tile_m=128, tile_n=144, cluster_m=2),
        # two promotion steps per 256-byte stage, stages alternating between two pairs of tiles
        GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True, stage_k_bytes=256),
    ],
    ids=lambda c: c.compile_key,
)
def test_promotion_sums_closer_to_the_exact_product_than_the_tensor_cores(config):
    """The same fp8 product written in fp32, accumulated on the tensor cores and promoted
    every 128 elements: promotion's error against the float32 product is at most half the
    other's, and no worse than torch._scaled_mm's without fast accumulation."""
    from gemmtune.kernels.build import compile_gemm
    from gemmtune.kernels.launch import launch

    a = random_tensor((512, 16384), torch.float8_e4m3fn)
    b = random_tensor((512, 16384), torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    reference = torch.matmul(a.float(), b.float())
    errors = {}
    for promoted in (False, True):
        problem = GemmProblem.from_tensors(a, b, None, torch.float32, promoted=promoted)
        kernel = compile_gemm(config, KernelSignature.of(problem))
        out = torch.empty(512, 512, device="cuda")
        launch(kernel, a, b, out, config, scales=(one, one))
        errors[promoted] = relative_error(out, reference)
    theirs = torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=False)
    print(
        f"fast {errors[False]:.2e}, promoted {errors[True]:.2e}, torch precise "
        f"{relative_error(theirs, reference):.2e}"
    )
    assert errors[True] <= errors[False] / 2
    assert errors[True] <= 2 * relative_error(theirs, reference) + 1e-6
