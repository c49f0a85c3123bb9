"""The Hopper kernel's bias on the GPU: 16-bit and fp8 products (scaled per tensor and per row,
fast and promoted), every decomposition, swapped (the bias along the tile's rows) or not,
TMA and thread stores, both output majors, ragged shapes, against the float32 product plus
the bias; and gemmtune.scaled_mm with a bias on our kernel, against torch._scaled_mm."""

import pytest
import torch

from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch, arch_of
from gemmtune.core.dtypes import torch_dtype
from gemmtune.core.problem import GemmProblem, scaled_reference
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.runner import random_bias, random_scales, random_tensor, reference_product
from gemmtune.measure.verify import poison, relative_error, tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(
        torch.cuda.is_available() and arch_of(0) is not Arch.SM90,
        reason="the Hopper kernel alone adds a bias",
    ),
]

# config key (raster/swizzle left out) | m x n x k | a b -> out dtype | out major | scaling
CASES = """
sm90_128x128_c1x1_coop_tma_dp          | 1001x1528x2064 | bf16 bf16 bf16 | n |
sm90_128x192_c2x1_pp_tma_dp            |   264x392x208  | fp16 fp16 fp16 | n |
sm90_128x96_c2x1_pp_st_dp              |   264x392x208  | bf16 bf16 fp32 | m |
sm90_64x16_c4x1_swap_pp_tma_k256_dp    |  16x4096x4096  | bf16 bf16 bf16 | n |
sm90_128x128_c2x1_coop_tma_sk4         |  520x512x32768 | bf16 bf16 bf16 | n |
sm90_64x16_c1x1_swap_pp_tma_k256_sk2   |   3x6144x4112  | bf16 bf16 bf16 | n |
sm90_128x256_c2x1_coop_tma_streamk     | 1024x4352x4096 | bf16 bf16 bf16 | n |
sm90_128x64_c1x1_swap_pp_st_streamk    |   33x1000x3008 | fp16 fp16 fp16 | n |
sm90_256x208_c1x2_coop_tma_dp          | 2999x2000x1024 | bf16 bf16 bf16 | n |
sm90_256x208_c1x1_swap_coop_tma_dp     | 1001x1528x2064 | bf16 bf16 bf16 | n |
sm90_128x168_c1x1_swap_pp_tma_dp       | 1001x1528x2064 | e4m3 e4m3 bf16 | n | row
sm90_128x160_c4x1_pp_tma_dp            | 1024x4352x4096 | e4m3 e4m3 bf16 | n | tensor
sm90_128x144_c2x1_pp_tma_sk2           | 1001x1528x2064 | e4m3 e5m2 bf16 | n | row
sm90_128x144_c2x1_coop_tma_dp          | 1001x4352x4112 | e4m3 e4m3 bf16 | n | tensor promoted
sm90_64x16_c4x1_swap_pp_tma_k256_dp    |  8x4096x14336  | e4m3 e4m3 bf16 | n | tensor promoted
sm90_128x128_c1x1_coop_tma_sk4         |  520x512x32768 | e4m3 e4m3 fp16 | n | row promoted
sm90_128x64_c1x1_swap_pp_st_streamk    |   33x1000x3008 | e4m3 e4m3 fp32 | m | tensor
"""
CASE_LINES = CASES.strip().splitlines()


def parse_case(line):
    key, shape, dtypes, out_major, scaling = (part.strip() for part in line.split("|"))
    a_dtype, b_dtype, out_dtype = dtypes.split()
    m, n, k = (int(x) for x in shape.split("x"))
    scaling, _, promoted = scaling.partition(" ")
    config = GemmConfig.from_key(key + "_rm_s1")
    return config, (m, n, k), a_dtype, b_dtype, out_dtype, out_major, scaling, bool(promoted)


@pytest.mark.parametrize("case", CASE_LINES, ids=[" ".join(c.split()) for c in CASE_LINES])
def test_the_kernel_adds_the_bias_to_the_product(case):
    from gemmtune.kernels.build import compile_gemm
    from gemmtune.kernels.launch import launch
    from gemmtune.kernels.sm90 import rules

    config, (m, n, k), a_name, b_name, out_name, out_major, scaling, promoted = parse_case(case)
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = random_tensor((m, k), torch_dtype(a_name), "cuda", gen)
    b = random_tensor((n, k), torch_dtype(b_name), "cuda", gen).t()  # x @ w.t()
    out_dtype = torch_dtype(out_name)
    out = torch.empty((n, m) if out_major == "m" else (m, n), device="cuda", dtype=out_dtype)
    out = out.t() if out_major == "m" else out
    poison(out)
    problem = GemmProblem.from_tensors(
        a, b, out, scaling=scaling or None, promoted=promoted, bias=True
    )
    assert rules.serves(config, problem) is None
    signature = KernelSignature.of(problem)
    scales = random_scales(signature, m, n, "cuda", gen)
    bias = random_bias(signature, n, k, "cuda", gen)
    kernel = compile_gemm(config, signature)
    launch(kernel, a, b, out, config, scales=scales, bias=bias)
    torch.cuda.synchronize()
    assert not out.isnan().any(), "some outputs were never written"
    err = relative_error(out, reference_product(a, b, scales, bias))
    assert err <= tolerance(out_dtype, a.dtype), err
    # the bias is as large as the product: an output without it is far off
    without = scaled_reference(a, b, *scales) if scales else a.float() @ b.float()
    assert relative_error(out, without) > 10 * tolerance(out_dtype, a.dtype)


@pytest.mark.parametrize("use_fast_accum", [True, False])
@pytest.mark.parametrize(("m", "n", "k"), [(16, 4096, 4096), (1000, 1520, 2064)])
def test_scaled_mm_adds_a_bias_on_our_kernel(monkeypatch, use_fast_accum, m, n, k):
    import gemmtune

    monkeypatch.setenv("GEMMTUNE_MODE", "heuristic")  # the model's first choice, untuned
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    a = random_tensor((m, k), torch.float8_e4m3fn, "cuda", gen)
    w = random_tensor((n, k), torch.float8_e4m3fn, "cuda", gen)
    sa, sb = torch.tensor(0.8, device="cuda"), torch.tensor(1.25, device="cuda")
    bias = torch.randn(n, device="cuda", generator=gen).mul(k**0.5).bfloat16()
    options = {"out_dtype": torch.bfloat16, "use_fast_accum": use_fast_accum, "bias": bias}
    reference = scaled_reference(a, w.t(), sa, sb) + bias.float()
    for _ in range(2):  # the first call of a signature is torch's; the second ours
        got = gemmtune.scaled_mm(a, w.t(), sa, sb, **options)
    plan = gemmtune.api.dispatch.DISPATCHER.scaled_plan(
        a, w.t(), sa, sb, torch.bfloat16, use_fast_accum, bias=bias
    )
    assert plan is not None and plan.config is not None, plan and plan.reason
    err = relative_error(got, reference)
    theirs = torch._scaled_mm(a, w.t(), sa, sb, **options)
    assert err <= tolerance(torch.bfloat16, torch.float8_e4m3fn), err
    assert err <= 2 * relative_error(theirs, reference) + 1e-3
    assert torch.equal(torch.ops.gemmtune.scaled_mm(a, w.t(), sa, sb, **options), got)
