"""What the GPU fuzz test covers, and that its element-wise check fails where it must (CPU)."""

import math

import torch
from fuzz_cases import BIASES, FP8, OUT_DTYPES, draw, make_bias, make_tensors, mismatches

from gemmtune.measure.verify import INTEGER_POISON


def test_draws_are_reproducible():
    assert draw(1234) == draw(1234)
    assert draw(1234) != draw(1235)


def test_a_thousand_draws_cover_every_feature():
    cases = [draw(seed) for seed in range(1000)]
    seen = set()
    for case in cases:
        seen.add(("dtype", case.dtype))
        seen.add(("batched", bool(case.batch)))
        seen.add(("a_row_major", case.a.row_major))
        seen.add(("b_row_major", case.b.row_major))
        seen.add(("sliced", case.a.pad > 0 or case.b.pad > 0))
        seen.add(("offset", case.a.offset > 0 or case.b.offset > 0))
        seen.add(("size_1", 1 in (case.m, case.n, case.k)))
        seen.add(("ragged", any(x % 8 for x in (case.m, case.n, case.k))))
        seen.add(("large", max(case.m, case.n, case.k) >= 2000))
        seen.add(("bias", case.bias))
        seen.add(("bias_of", case.bias, case.dtype == torch.int8))
        if case.out is None:
            seen.add(("out_dtype", case.out_dtype))
        else:
            seen.add(("out_row_major", case.out.row_major))
            seen.add(("out_of_dtype", case.out_dtype))
    expected = {
        *((key, value) for key in ("batched", "a_row_major", "b_row_major") for value in (0, 1)),
        *(("dtype", d) for d in (torch.bfloat16, torch.float16, torch.int8, *FP8)),
        ("out_dtype", torch.int32), ("out_of_dtype", torch.int32),
        *(("out_dtype", d) for d in (None, *OUT_DTYPES)),
        *(("out_of_dtype", d) for d in (None, *OUT_DTYPES)),
        ("out_row_major", True), ("out_row_major", False),
        ("sliced", True), ("offset", True), ("size_1", True), ("ragged", True), ("large", True),
        *(("bias", kind) for kind in (None, *BIASES)),
        *(("bias_of", kind, False) for kind in BIASES),
        *(("bias_of", kind, True) for kind in ("vector", "strided", "matrix")),
    }  # fmt: skip
    assert expected <= seen, expected - seen


def test_tensors_are_the_views_the_case_describes():
    for seed in range(300):
        case = draw(seed)
        a, b, out = make_tensors(case, "cpu")
        batch = (case.batch,) if case.batch else ()
        assert a.shape == (*batch, case.m, case.k) and b.shape == (*batch, case.k, case.n)
        assert a.storage_offset() == case.a.offset and b.storage_offset() == case.b.offset
        inner = -1 if case.a.row_major else -2
        outer = -2 if case.a.row_major else -1
        if a.shape[inner] > 1 and a.shape[outer] > 1:
            assert a.stride(outer) == a.shape[inner] + case.a.pad
        if out is not None:
            poisoned = out.isnan() if out.is_floating_point() else out == INTEGER_POISON
            assert out.shape == (*batch, case.m, case.n) and poisoned.all()
            assert out.dtype == case.result_dtype
        assert make_tensors(case, "cpu")[0].equal(a)  # the data is the seed's
        bias = make_bias(case, "cpu")
        if case.bias is None:
            assert bias is None
            continue
        expected_shape = (case.m, case.n) if case.bias == "matrix" else (case.n,)
        assert bias.shape == expected_shape and bias.equal(make_bias(case, "cpu"))
        assert (bias.dtype == case.result_dtype) == (case.bias != "other")
        assert (bias.stride() == (2,)) == (case.bias == "strided")
        torch.broadcast_shapes(bias.shape, out.shape if out is not None else (case.m, case.n))


def test_mismatches_counts_a_single_wrong_element_and_nan():
    torch.manual_seed(0)
    k = 4096
    reference = torch.randn(256, 256) * math.sqrt(k)
    close = reference.to(torch.bfloat16)  # output rounding only
    assert mismatches(close, reference, k) == 0
    wrong = close.clone()
    wrong[200, 17] += 0.2 * reference.abs().max()
    assert mismatches(wrong, reference, k) == 1
    wrong[3, 3] = math.nan
    assert mismatches(wrong, reference, k) == 2


def test_an_fp8_element_may_err_with_the_sum_of_its_products_magnitudes():
    k = 2544
    reference = torch.zeros(1, 2)
    magnitude = torch.full((1, 2), 0.64 * k)  # |a| @ |b| of randn-like operands
    got = torch.tensor([[0.76, 0.76]])  # fast accumulation's worst seen at this k
    assert mismatches(got, reference, k, fp8=True) == 2  # beyond the square-root term
    assert mismatches(got, reference, k, fp8=True, magnitude=magnitude) == 0
    got[0, 1] = math.sqrt(128)  # a k-tile of 128 products missed, typically: beyond both
    assert mismatches(got, reference, k, fp8=True, magnitude=magnitude) == 1
    # the bound is the fp8 products' only
    assert mismatches(got, reference, k, magnitude=magnitude) == 2


def test_eight_bit_cases_cover_every_layout_and_mostly_the_one_their_mmas_read():
    cases = [draw(seed) for seed in range(1000)]
    eight_bit = [c for c in cases if c.dtype.itemsize == 1]
    layouts = {(c.a.row_major, c.b.row_major) for c in eight_bit}
    k_major = [c for c in eight_bit if c.a.row_major and not c.b.row_major]
    # the other three layouts run on K-major copies: each is drawn
    assert len(layouts) == 4 and len(k_major) >= 0.55 * len(eight_bit)
