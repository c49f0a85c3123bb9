"""The Hopper kernel on the GPU: every tile, cluster, schedule and epilogue, all four layouts,
every output dtype and major, ragged, tiny and batched shapes, swapped operands (out^T =
b^T @ a^T), against a float32 reference; int8 bit for bit against the exact int32 product."""

import dataclasses

import pytest
import torch

from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch, arch_of
from gemmtune.core.dtypes import torch_dtype
from gemmtune.core.problem import GemmProblem
from gemmtune.measure.runner import random_tensor, reference_product
from gemmtune.measure.verify import poison, relative_error, tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        torch.cuda.is_available() and arch_of(0) is not Arch.SM90,
        reason="the Hopper kernel's cases run on an sm_90 GPU (test_sm100_gpu.py on a B200)",
    ),
]


def operands(m, n, k, l, layout, ab, out_dtype, out_major, seed):
    """Random a (l?, m, k), b (l?, k, n) with majors from `layout` ("tn": A K-major, B N-major),
    and a poisoned output (NaN, or int32's least value)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch_dtype(ab)
    lead = (l,) if l > 1 else ()

    def rand(rows, cols, transposed):
        shape = (*lead, cols, rows) if transposed else (*lead, rows, cols)
        t = random_tensor(shape, dt, "cuda", gen)
        return t.transpose(-1, -2) if transposed else t

    a = rand(m, k, layout[0] == "n")  # "n": A is M-major
    b = rand(k, n, layout[1] == "t")  # "t": B is K-major
    out_shape = (*lead, n, m) if out_major == "m" else (*lead, m, n)
    out = torch.empty(out_shape, device="cuda", dtype=torch_dtype(out_dtype))
    poison(out)
    if out_major == "m":
        out = out.transpose(-1, -2)
    return a, b, out


def rel_err(out, a, b):
    return relative_error(out, reference_product(a, b))


def tolerance_of(name: str) -> float:
    return tolerance(torch_dtype(name))


# config key (raster/swizzle left out) | m x n x k x l | layout | ab -> out dtype | out major
CASES = """
sm90_128x256_c2x1_coop_tma_dp | 1001x1528x2056x1 | tn | bf16 fp32 | n
sm90_128x256_c2x1_coop_tma_dp | 1001x1528x2064x1 | tt | int8 int32 | n
sm90_128x128_c1x1_pp_st_dp    |   264x392x208x1 | tt | int8 int32 | m
sm90_64x256_c1x2_pp_tma_dp    | 4096x4096x4096x1 | tt | int8 int32 | n
sm90_256x128_c1x1_coop_st_dp  |  1000x1528x2064x2 | tt | int8 int32 | n
sm90_128x32_c1x1_swap_pp_tma_dp |  16x4096x4096x1 | tt | int8 int32 | n
sm90_64x16_c2x1_swap_pp_tma_dp  |   1x8192x1024x1 | tt | int8 int32 | n
sm90_128x128_c1x1_coop_tma_sk4  |  520x512x32768x1 | tt | int8 int32 | n
sm90_128x64_c1x1_swap_coop_st_sk3 | 16x4096x8192x1 | tt | int8 int32 | m
sm90_128x256_c2x1_coop_tma_streamk | 1024x4352x4096x1 | tt | int8 int32 | n
sm90_64x128_c1x1_pp_st_streamk  |  1000x1528x2064x2 | tt | int8 int32 | m
sm90_128x256_c1x1_coop_tma_dp | 2999x4104x1000x1 | tn | fp16 fp16 | n
sm90_256x128_c1x2_coop_tma_dp | 3000x4104x1000x1 | nt | bf16 bf16 | n
sm90_256x192_c2x2_coop_tma_dp | 1000x1528x2056x1 | nn | bf16 fp32 | n
sm90_128x192_c1x2_coop_tma_dp |        1x8x64x1 | tn | bf16 bf16 | n
sm90_128x64_c1x1_coop_tma_dp  |         1x8x8x1 | tt | fp16 fp32 | n
sm90_128x128_c2x1_coop_st_dp  |   264x385x200x1 | tt | bf16 bf16 | m
sm90_256x64_c1x1_coop_st_dp   |   1000x1528x72x1 | nn | fp16 fp16 | n
sm90_128x160_c2x2_coop_tma_dp |  520x4104x1000x3 | tn | bf16 bf16 | m
sm90_128x224_c1x2_coop_st_dp  |   200x136x520x2 | nt | bf16 fp32 | m
sm90_64x256_c1x1_pp_tma_dp    | 2999x4104x1000x1 | tn | bf16 bf16 | n
sm90_64x128_c2x1_pp_tma_dp    | 1001x1528x2056x1 | tt | fp16 fp16 | n
sm90_128x192_c2x1_pp_tma_dp   |  4096x4096x512x1 | tn | bf16 bf16 | n
sm90_128x128_c1x2_pp_tma_dp   |   96x4104x1000x1 | nn | bf16 fp32 | n
sm90_128x64_c2x2_pp_tma_dp    | 1024x1024x1024x3 | nt | fp16 fp16 | n
sm90_64x192_c1x1_pp_st_dp     |   264x392x200x2 | tn | bf16 bf16 | m
sm90_128x96_c2x1_pp_st_dp     |        1x8x64x1 | tt | bf16 bf16 | n
sm90_64x64_c1x2_pp_tma_dp     |   3000x8x4096x1 | tn | bf16 bf16 | n
sm90_256x96_c2x1_coop_tma_dp  |  1000x1000x1000x1 | nt | fp16 bf16 | m
sm90_128x128_c1x1_coop_tma_sk4 |   520x512x32768x1 | tn | bf16 bf16 | n
sm90_128x256_c2x1_coop_st_sk3  | 1001x1528x2056x2 | tt | bf16 fp32 | n
sm90_64x128_c1x2_pp_tma_sk16   |   256x1024x8200x1 | nt | fp16 fp16 | m
sm90_128x160_c2x1_pp_st_sk2    |    264x392x200x3 | nn | bf16 bf16 | n
sm90_128x128_c1x1_coop_tma_sk16 | 2048x2056x4096x1 | tn | bf16 bf16 | n
sm90_128x256_c2x2_coop_tma_sk5 |  1000x1000x3000x2 | nn | bf16 fp32 | m
sm90_128x128_c1x1_coop_tma_streamk | 1024x4352x4096x1 | tn | bf16 bf16 | n
sm90_128x256_c2x1_coop_tma_streamk | 2999x4104x1000x1 | tn | fp16 fp16 | n
sm90_256x128_c1x2_coop_st_streamk  | 1000x1528x2056x2 | nt | bf16 fp32 | m
sm90_64x256_c1x1_pp_tma_streamk    |   512x512x32768x1 | tt | bf16 bf16 | n
sm90_128x160_c2x1_pp_st_streamk    |    264x392x200x3 | nn | fp16 fp16 | m
sm90_128x128_c2x2_pp_tma_streamk   |         1x8x64x1 | tn | bf16 bf16 | n
sm90_256x144_c1x1_coop_tma_dp      |  2048x2304x1000x1 | tn | bf16 bf16 | n
sm90_256x144_c1x2_coop_tma_dp      | 1000x1528x2056x1 | nt | fp16 fp16 | m
sm90_256x144_c2x1_coop_st_dp       | 2999x4104x1000x2 | tt | bf16 fp32 | n
sm90_128x144_c1x1_coop_tma_dp      |   264x392x200x1 | nn | bf16 fp32 | m
sm90_256x144_c2x1_coop_st_dp       | 1000x1528x2056x1 | nt | bf16 bf16 | m
sm90_192x192_c1x1_coop_tma_dp      | 2048x2304x1000x1 | tn | bf16 bf16 | n
sm90_192x192_c2x1_coop_tma_dp      | 1000x1528x2056x2 | nt | fp16 fp16 | m
sm90_192x128_c1x2_coop_st_dp       | 3000x4104x1000x1 | nn | bf16 fp32 | n
sm90_192x160_c2x2_coop_tma_dp      |   264x392x200x1 | tt | bf16 fp32 | m
sm90_192x160_c2x1_coop_st_dp       | 1000x1528x2056x1 | tn | bf16 bf16 | m
sm90_192x128_c1x2_swap_coop_st_dp  | 2999x4104x1000x1 | tt | bf16 bf16 | n
sm90_192x96_c1x1_coop_st_streamk   |    264x392x200x2 | nn | fp16 fp16 | m
sm90_192x96_c1x1_coop_tma_sk3      | 1000x1000x3000x2 | tn | bf16 bf16 | n
sm90_192x192_c1x2_coop_tma_streamk | 2048x2304x8192x1 | tn | fp16 fp16 | n
sm90_128x144_c2x1_pp_tma_dp        | 1000x1528x2056x1 | tn | bf16 bf16 | m
sm90_64x144_c1x2_pp_st_dp          |   264x392x200x2 | nt | fp16 fp16 | n
sm90_256x144_c2x1_coop_tma_streamk | 2048x2304x4096x1 | tn | bf16 bf16 | n
sm90_128x144_c2x1_coop_tma_streamk | 1000x4352x4104x1 | tn | bf16 bf16 | n
sm90_128x144_c1x1_coop_tma_streamk |  300x1000x8200x1 | tn | bf16 bf16 | n
sm90_128x176_c1x1_coop_tma_streamk |  300x1000x8200x1 | tn | fp16 fp16 | n
sm90_128x144_c1x1_pp_tma_sk4       |   512x512x8192x1 | tt | bf16 bf16 | n
sm90_256x208_c1x2_swap_coop_tma_dp | 4096x3000x1000x1 | tn | bf16 bf16 | n
sm90_256x208_c2x1_coop_st_dp       | 2999x4104x1000x1 | tt | bf16 bf16 | n
sm90_128x208_c2x1_pp_tma_dp        | 1000x1528x2056x1 | nt | fp16 fp16 | m
sm90_64x208_c1x1_swap_pp_st_dp     |      8x1000x640x1 | tn | bf16 bf16 | n
sm90_128x208_c2x2_coop_tma_streamk | 1000x1528x2056x1 | nn | bf16 bf16 | n
sm90_128x256_c2x1_swap_coop_tma_streamk | 1000x1528x2056x2 | nt | bf16 fp32 | m
sm90_128x128_c1x1_swap_coop_tma_sk4 |   520x512x32768x1 | tt | bf16 bf16 | n
sm90_192x192_c1x2_swap_coop_st_dp  |        8x8x64x1 | nn | fp16 fp16 | m
sm90_64x176_c1x2_swap_pp_tma_dp    |  333x4096x4096x1 | tt | bf16 bf16 | n
sm90_128x80_c1x4_swap_coop_tma_dp  |  640x1800x3000x1 | tn | bf16 bf16 | n
sm90_128x80_c4x1_pp_st_dp          |   1000x1528x2056x2 | nt | fp16 fp32 | m
sm90_256x112_c1x4_coop_tma_streamk | 2999x4104x1000x1 | tn | bf16 bf16 | n
sm90_64x112_c4x1_swap_pp_tma_sk3   |   520x512x32768x1 | tt | bf16 bf16 | n
sm90_128x176_c1x4_coop_st_sk4      |  1000x1000x3000x2 | nn | bf16 fp32 | m
sm90_192x80_c4x1_coop_tma_streamk  |    264x392x200x1 | tt | fp16 fp16 | n
sm90_128x16_c1x1_swap_coop_tma_k256_dp | 16x4096x4096x1 | tt | bf16 bf16 | n
sm90_64x32_c4x1_swap_pp_tma_k256_dp  |  13x6144x4104x1 | tn | fp16 fp16 | n
sm90_64x16_c1x2_swap_pp_st_k256_sk3  |  5x8192x14336x1 | tt | bf16 fp32 | n
sm90_128x32_c1x1_swap_pp_tma_k256_streamk | 16x4096x8200x1 | tt | bf16 bf16 | n
sm90_64x16_c2x1_swap_pp_tma_k256_dp  |   1x8192x1040x1 | tt | int8 int32 | n
sm90_128x48_c1x1_pp_tma_k256_dp      |  1000x48x2056x2 | nn | bf16 bf16 | m
sm90_256x88_c2x1_swap_coop_tma_dp    |   777x3584x3584x1 | tt | bf16 bf16 | n
sm90_128x104_c4x1_swap_pp_tma_dp     |   300x9216x3072x1 | tn | fp16 fp16 | n
sm90_128x200_c1x1_swap_coop_tma_dp   |  200x14336x4096x1 | tt | bf16 fp32 | n
sm90_64x168_c1x2_swap_pp_tma_sk4     |   333x4096x4096x1 | tn | bf16 bf16 | n
sm90_128x88_c1x1_coop_tma_dp         |  1000x1528x2056x1 | tn | bf16 bf16 | n
sm90_192x152_c1x2_coop_tma_dp        |    264x392x208x2 | nt | fp16 fp16 | m
sm90_64x200_c2x2_pp_tma_dp           |  1000x1528x2056x1 | nn | bf16 fp32 | m
sm90_128x104_c1x1_swap_coop_tma_sk3  |   100x3584x18944x1 | tt | bf16 bf16 | n
sm90_64x56_c2x2_swap_pp_tma_dp       |  100x3584x18944x1 | tn | bf16 bf16 | n
sm90_128x56_c1x2_swap_coop_tma_sk2   |    50x4096x4104x1 | tt | fp16 fp32 | n
sm90_256x56_c1x1_coop_tma_dp         |    264x392x208x2 | nt | fp16 fp16 | m
sm90_128x176_c1x2_coop_st_dp         | 2050x2100x2000x1 | tt | bf16 bf16 | n
sm90_64x48_c1x1_pp_st_dp             |    7x2101x512x1 | tt | fp16 fp16 | n
sm90_64x32_c1x1_swap_pp_st_k256_sk2  |  16x50257x1024x1 | tt | bf16 bf16 | n
sm90_128x128_c1x1_coop_st_streamk    | 1000x1001x2064x2 | tt | int8 int32 | n
sm90_128x64_c2x1_pp_st_sk3           |   333x520x1000x1 | tt | fp16 fp32 | m
"""
#: the cases above whose outputs TMA cannot store (rows or columns not 16-byte aligned)
UNALIGNED_CASES = 5


def parse_case(line):
    key, shape, layout, dtypes, out_major = (part.strip() for part in line.split("|"))
    config = GemmConfig.from_key(key + "_rm_s1")  # a split-K key carries its split count
    ab, out_dtype = dtypes.split()
    return config, tuple(int(x) for x in shape.split("x")), layout, ab, out_dtype, out_major


CASE_LINES = [line for line in CASES.strip().splitlines()]

_kernels: dict = {}


def kernel_for(config, problem):
    from gemmtune.kernels.build import compile_gemm
    from gemmtune.kernels.signature import KernelSignature

    signature = KernelSignature.of(problem)
    key = (config.compile_key, signature)
    if key not in _kernels:
        _kernels[key] = compile_gemm(config, signature)
    return _kernels[key]


@pytest.mark.parametrize("case", CASE_LINES, ids=[" ".join(c.split()) for c in CASE_LINES])
def test_kernel_matches_reference(case):
    from gemmtune.kernels.sm90 import rules

    check_case(case, rules)


def check_case(case, rules):
    """One line of a CASES table, on the kernel whose `rules` serve it: NaN-poisoned output,
    every element written, within the dtype's tolerance, a reduction bitwise repeatable."""
    from gemmtune.kernels.launch import launch

    config, shape, layout, ab, out_dtype, out_major = parse_case(case)
    m, n, k, l = shape
    a, b, out = operands(m, n, k, l, layout, ab, out_dtype, out_major, seed=m + n + k)
    problem = GemmProblem.from_tensors(a, b, out)
    assert rules.serves(config, problem) is None
    kernel = kernel_for(config, problem)
    launch(kernel, a, b, out, config)
    torch.cuda.synchronize()
    assert not out.isnan().any(), "some outputs were never written"
    assert rel_err(out, a, b) <= tolerance_of(out_dtype)
    if config.decomposition.value != "data_parallel":
        # partials are summed in a fixed order, and the counters were left at zero: a
        # second run is bitwise the same
        first = out.clone()
        poison(out)
        launch(kernel, a, b, out, config)
        torch.cuda.synchronize()
        assert torch.equal(out, first)


@pytest.mark.parametrize("case", CASE_LINES[-UNALIGNED_CASES:])
def test_unaligned_outputs_are_written_by_direct_stores_only(case):
    from gemmtune.kernels.sm90 import rules

    config, (m, n, k, l), layout, ab, out_dtype, out_major = parse_case(case)
    a, b, out = operands(m, n, k, l, layout, ab, out_dtype, out_major, seed=0)
    problem = GemmProblem.from_tensors(a, b, out)
    assert not problem.out_aligned
    assert "TMA cannot store" in rules.serves(dataclasses.replace(config, tma_store=True), problem)


def test_an_output_at_an_unaligned_address_is_written_exactly_there():
    """An output two bytes past a 16-byte boundary (a view into a larger buffer); the elements
    around it are left as they were."""
    from gemmtune.kernels.launch import launch

    config = GemmConfig.from_key("sm90_128x64_c1x1_coop_st_dp_rm_s1")
    a, b, _ = operands(300, 256, 512, 1, "tt", "bf16", "bf16", "n", seed=3)
    buffer = torch.zeros(300 * 256 + 2, device="cuda", dtype=torch.bfloat16)
    out = buffer[1:-1].view(300, 256)
    poison(out)
    problem = GemmProblem.from_tensors(a, b, out)
    assert problem.supported and not problem.out_aligned
    launch(kernel_for(config, problem), a, b, out, config)
    torch.cuda.synchronize()
    assert not out.isnan().any() and buffer[0] == 0 and buffer[-1] == 0
    assert rel_err(out, a, b) <= tolerance_of("bf16")


@pytest.mark.parametrize("schedule", ["cooperative", "pingpong"])
def test_raster_and_swizzle_change_nothing_but_order(schedule):
    """Every (raster, swizzle) of one binary gives bitwise the same output."""
    from gemmtune.kernels.launch import launch

    config = GemmConfig(tile_m=128, tile_n=128, cluster_m=2, schedule=schedule)
    a, b, out = operands(1500, 2104, 704, 2, "tn", "bf16", "bf16", "n", seed=7)
    kernel = kernel_for(config, GemmProblem.from_tensors(a, b, out))
    results = []
    for raster in ("along_m", "along_n"):
        for swizzle in (1, 2, 4, 8):
            out.fill_(float("nan"))
            launch(kernel, a, b, out, config.with_runtime(raster=raster, swizzle=swizzle))
            results.append(out.clone())
    torch.cuda.synchronize()
    assert rel_err(results[0], a, b) < tolerance_of("bf16")
    for r in results[1:]:
        assert torch.equal(r, results[0])


def test_back_to_back_launches_see_the_previous_kernels_writes():
    """Kernels are launched with programmatic dependent launch: each must still read only what
    the kernel before it wrote. Buffers are rewritten between launches (a torch copy before
    the first GEMM, a GEMM's output feeding the next), with inputs alternating so that a read
    of the previous round's data shows."""
    from gemmtune.kernels.launch import launch

    gen = torch.Generator(device="cuda").manual_seed(3)
    sources = [torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)]
    sources.append(-sources[0].flip(0))
    b = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)
    e = torch.randn(2048, 1536, device="cuda", dtype=torch.bfloat16, generator=gen)
    a = torch.empty_like(sources[0])
    c = torch.empty(2048, 2048, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(2048, 1536, device="cuda", dtype=torch.bfloat16)
    first = GemmConfig.from_key("sm90_128x256_c2x1_coop_tma_dp_rm_s8")
    second = GemmConfig.from_key("sm90_128x128_c1x1_coop_tma_streamk_rm_s1")
    first_kernel = kernel_for(first, GemmProblem.from_tensors(a, b, c))
    second_kernel = kernel_for(second, GemmProblem.from_tensors(c, e, d))
    results = []
    for i in range(8):
        a.copy_(sources[i % 2])
        launch(first_kernel, a, b, c, first)
        launch(second_kernel, c, e, d, second)
        results.append(d.clone())
    torch.cuda.synchronize()
    for i, result in enumerate(results):
        c_ref = (sources[i % 2].float() @ b.float()).to(torch.bfloat16)
        assert rel_err(result, c_ref, e) < tolerance_of("bf16"), f"round {i}"
