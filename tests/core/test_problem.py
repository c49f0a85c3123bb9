"""GemmProblem on the CPU: tensors are described by `Operand`s placed on a pretend GPU."""

import pytest
import torch

from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand, fallback_matmul
from gemmtune.kernels.signature import KernelSignature

CUDA = torch.device("cuda", 0)
BF16 = torch.bfloat16


def op(shape, stride=None, dtype=BF16, device=CUDA, ptr=1 << 20):
    """An operand like a tensor of `shape` (row-major unless `stride` says otherwise)."""
    if stride is None:
        stride = torch.empty(shape, device="meta").stride()
    return Operand(tuple(shape), tuple(stride), dtype, torch.device(device), ptr)


def col(shape, dtype=BF16, ptr=1 << 20):
    """A column-major (last two dims swapped) operand of `shape`."""
    *batch, r, c = shape
    stride = (r * c, 1, r) if batch else (1, r)
    return op(shape, stride, dtype, ptr=ptr)


def problem(a, b, out=None, out_dtype=None, arch=Arch.SM90):
    return GemmProblem.from_operands(a, b, out, out_dtype, arch=arch)


def codes(p):
    return [r.code for r in p.fallback_reasons]


def test_row_major_2d_is_tn_and_supported():
    p = problem(op((256, 512)), op((512, 1024)))
    assert (p.m, p.n, p.k, p.l) == (256, 1024, 512, 1)
    assert (p.a_major, p.b_major, p.out_major) == ("k", "n", "n")
    assert p.layout == "tn"
    assert not p.batched and p.supported and p.fallback_reason is None
    assert p.out_dtype == BF16 and p.out_shape == (256, 1024)
    assert p.flops == 2 * 256 * 1024 * 512


@pytest.mark.parametrize(
    ("a_col", "b_col", "layout", "majors"),
    [
        (False, False, "tn", ("k", "n")),
        (False, True, "tt", ("k", "k")),
        (True, False, "nn", ("m", "n")),
        (True, True, "nt", ("m", "k")),
    ],
)
def test_four_layouts_from_strides(a_col, b_col, layout, majors):
    a = col((64, 128)) if a_col else op((64, 128))
    b = col((128, 32)) if b_col else op((128, 32))
    p = problem(a, b)
    assert p.layout == layout
    assert (p.a_major, p.b_major) == majors
    assert p.supported


def test_batched_and_column_major_out():
    a, b = op((3, 64, 128)), col((3, 128, 32))
    out = col((3, 64, 32), dtype=torch.float32)
    p = problem(a, b, out)
    assert p.batched and p.l == 3 and p.out_shape == (3, 64, 32)
    assert p.out_major == "m" and p.out_dtype == torch.float32
    assert p.supported


def test_out_dtype_choice():
    p = problem(op((64, 64)), op((64, 64)), out_dtype=torch.float16)
    assert p.out_dtype == torch.float16 and p.supported


def test_int8_row_major_a_times_column_major_b_is_an_exact_int32_product():
    i8 = torch.int8
    p = problem(op((64, 128), dtype=i8), col((128, 32), dtype=i8))
    assert p.supported and p.out_dtype == torch.int32 and p.layout == "tt"
    assert p.copied == ()
    with pytest.raises(TypeError, match="int32 for int8 inputs"):
        problem(op((64, 128), dtype=i8), col((128, 32), dtype=i8), out_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        problem(op((64, 128)), op((128, 32)), out_dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize(
    ("a_col", "b_col", "layout", "copied"),
    [(False, False, "tn", ("b",)), (True, True, "nt", ("a",)), (True, False, "nn", ("a", "b"))],
)
def test_8bit_operands_in_the_other_major_are_copied(dtype, a_col, b_col, layout, copied):
    a = (col if a_col else op)((64, 128), dtype=dtype)
    b = (col if b_col else op)((128, 32), dtype=dtype)
    p = problem(a, b)
    # the kernel reads both K-major; the layout is the call's, for the bucket and reports
    assert p.supported and p.copied == copied and p.layout == layout
    assert (p.a_major, p.b_major) == ("k", "k")
    sig = KernelSignature.of(p)
    assert (sig.a_major, sig.b_major) == ("k", "k")


def test_a_copied_operand_needs_no_alignment_of_its_own():
    i8 = torch.int8
    # rows of 100 bytes: TMA could not load b as it is, but its K-major copy has padded rows
    b = op((100, 100), dtype=i8)
    p = problem(op((64, 100), stride=(112, 1), dtype=i8), b)
    assert p.supported and p.copied == ("b",)
    # the operand read as it is must still suit TMA
    p = problem(op((64, 100), dtype=i8), b)
    assert codes(p) == ["alignment"] and "a's stride" in p.fallback_reason.detail
    # 16-bit inputs are read in either major: nothing is copied
    assert problem(op((64, 128)), op((128, 32))).copied == ()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16bit_operand_in_the_other_major_with_strides_tma_cannot_take_is_copied(dtype):
    """`x @ w` of a row-major weight of 2,100 columns (rows of 4,200 bytes), and a
    column-major `a` of 1,001 rows: each is multiplied as a K-major copy with padded rows."""
    p = problem(op((2050, 2000), dtype=dtype), op((2000, 2100), dtype=dtype))
    assert p.supported and p.copied == ("b",) and p.layout == "tn"
    assert (p.a_major, p.b_major) == ("k", "k") and not p.out_aligned
    p = problem(col((1001, 64), dtype=dtype), op((64, 128), dtype=dtype))
    assert p.supported and p.copied == ("a",) and p.layout == "nn"
    # both at once
    p = problem(col((1001, 64), dtype=dtype), op((64, 2100), dtype=dtype))
    assert p.supported and p.copied == ("a", "b")


def test_a_16bit_operand_is_copied_only_for_its_strides():
    # aligned strides: read as it is
    assert problem(op((64, 64)), op((64, 2104))).copied == ()
    # K-major with a row stride TMA cannot take: a copy would only pad it; torch serves it
    p = problem(op((64, 2100), stride=(2101, 1)), op((2100, 64)))
    assert codes(p) == ["alignment"] and p.copied == ()
    # an address TMA cannot take goes to torch, strides or not: a plan is made per strides, and
    # the calls that share them need not share the address's alignment
    b = op((64, 2100), ptr=(1 << 20) + 2)
    assert codes(problem(op((64, 64)), b)) == ["alignment"]
    assert codes(problem(op((64, 64)), op((64, 2104), ptr=(1 << 20) + 2))) == ["alignment"]


def test_fp8_on_blackwell_takes_fast_accumulation_and_no_bias():
    fp8 = {"dtype": torch.float8_e4m3fn, "out_dtype": torch.bfloat16, "layout": "tt"}
    for scaling in ("tensor", "row"):
        p = GemmProblem.of_shape(512, 256, 1024, **fp8, arch=Arch.SM100, scaling=scaling)
        assert p.supported, p.fallback_reason
    promoted = GemmProblem.of_shape(512, 256, 1024, **fp8, arch=Arch.SM100, promoted=True)
    assert promoted.fallback_reason.code == "dtype" and "Hopper" in str(promoted.fallback_reason)
    assert GemmProblem.of_shape(512, 256, 1024, **fp8, arch=Arch.SM90, promoted=True).supported
    biased = GemmProblem.of_shape(512, 256, 1024, **fp8, arch=Arch.SM100, bias=True)
    assert [r.code for r in biased.fallback_reasons] == ["bias"]


def test_tiny_m1_vector_is_supported():
    p = problem(op((1, 64)), op((64, 8)))
    assert p.a_major == "k" and p.supported


# --- errors: each names the argument ------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "exc", "match"),
    [
        (op((4, 8)), op((16, 8)), ValueError, "inner dimensions differ"),
        (op((2, 4, 8)), op((3, 8, 8)), ValueError, "batch sizes differ"),
        (op((4, 8), device="cpu"), op((8, 8)), ValueError, "a is on cpu"),
        (op((4, 8)), op((8, 8), device="cpu"), ValueError, "b is on cpu"),
        (op((4, 8)), op((8, 8), device="cuda:1"), ValueError, "a is on cuda:0 but b is on cuda:1"),
        (op((2, 2, 4, 8)), op((8, 8)), ValueError, "a must be 2-D or 3-D"),
        (op((4, 8)), op((8,)), ValueError, "b must be 2-D or 3-D"),
        (op((4, 8), dtype=torch.int32), op((8, 8)), TypeError, "a has dtype torch.int32"),
        (op((4, 8)), op((8, 8), dtype=torch.uint8), TypeError, "b has dtype torch.uint8"),
        (op((4, 8)), op((8, 8), dtype=torch.int8), TypeError, "must match"),
        (op((4, 8), dtype=torch.float16), op((8, 8)), TypeError, "must match"),
        (op((4, 8), dtype=torch.bool), op((8, 8)), TypeError, "a has dtype torch.bool"),
    ],
)
def test_wrong_calls_raise_naming_the_argument(a, b, exc, match):
    with pytest.raises(exc, match=match):
        problem(a, b)


def test_operand_of_rejects_non_tensors():
    with pytest.raises(TypeError, match=r"b must be a torch\.Tensor"):
        Operand.of([1, 2], "b")


@pytest.mark.parametrize(
    ("out", "out_dtype", "exc", "match"),
    [
        (op((4, 9)), None, ValueError, r"out has shape \(4, 9\), expected \(4, 8\)"),
        (op((4, 8), device="cuda:1"), None, ValueError, "out is on cuda:1"),
        (op((4, 8), dtype=torch.float16), torch.bfloat16, TypeError, "out has dtype"),
        (op((4, 8), dtype=torch.int32), None, TypeError, "out has dtype torch.int32"),
        (None, torch.int8, TypeError, "out_dtype torch.int8"),
    ],
)
def test_bad_out_raises(out, out_dtype, exc, match):
    with pytest.raises(exc, match=match):
        problem(op((4, 16)), op((16, 8)), out, out_dtype)


# --- fallback reasons: legal, but not our kernels' ----------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "code", "detail"),
    [
        ({"a": op((0, 64)), "b": op((64, 64))}, "zero_size", "m=0"),
        ({"a": op((64, 64)), "b": op((64, 0))}, "zero_size", "n=0"),
        ({"a": op((64, 0)), "b": op((0, 64))}, "zero_size", "k=0"),
        ({"a": op((0, 64, 64)), "b": op((0, 64, 64))}, "zero_size", "l=0"),
        ({"a": op((64, 64)), "b": op((64, 64)), "arch": Arch.OTHER}, "arch", "sm_90 and sm_100"),
        (
            {"a": op((64, 64), dtype=torch.float32), "b": op((64, 64), dtype=torch.float32)},
            "dtype",
            "float32",
        ),
        (
            {"a": op((64, 64)), "b": op((64, 64)), "out_dtype": torch.float64},
            "dtype",
            "float64",
        ),
        ({"a": op((64, 64), stride=(128, 2)), "b": op((64, 64))}, "layout", "a has strides"),
        ({"a": op((64, 64)), "b": op((64, 64), stride=(2, 128))}, "layout", "b has strides"),
        (
            {"a": op((64, 64)), "b": op((64, 64)), "out": op((64, 64), stride=(64, 64))},
            "layout",
            "out has strides",
        ),
        ({"a": op((64, 64), ptr=(1 << 20) + 2), "b": op((64, 64))}, "alignment", "data pointer"),
        ({"a": op((64, 60)), "b": op((60, 64))}, "alignment", "stride 60 along dim 0"),
        ({"a": col((64, 20)), "b": col((20, 64))}, "alignment", "b's stride 20"),
        ({"a": col((64, 36)), "b": col((36, 64))}, "alignment", "b's stride 36"),
        ({"a": op((64, 64), ptr=(1 << 20) + 8), "b": op((64, 64))}, "alignment", "a's data"),
        ({"a": op((2, 64, 64)), "b": op((1, 64, 64))}, "broadcast", "2 against 1"),
        ({"a": op((2, 64, 64)), "b": op((64, 64))}, "broadcast", "3-D operand against a 2-D"),
    ],
)
def test_fallback_reasons(kwargs, code, detail):
    p = problem(**kwargs)
    assert not p.supported
    assert code in codes(p)
    assert any(detail in str(r) for r in p.fallback_reasons), p.fallback_reasons


def test_an_output_tma_cannot_store_is_served_unaligned():
    """Rows of 20 bf16 values (40 bytes) or of 6 fp32 values (24): TMA cannot store them, a
    kernel storing element by element can, so the problem is served with `out_aligned` false."""
    p = problem(op((64, 64)), op((64, 8)), out_dtype=torch.float32)
    assert p.supported and p.out_aligned
    for b, out_dtype in ((col((64, 6)), torch.float32), (col((64, 20)), None)):
        p = problem(op((64, 64)), b, out_dtype=out_dtype)
        assert p.supported and not p.out_aligned
    # a base aligned to the element but not to 16 bytes: unaligned too
    p = problem(op((64, 64)), op((64, 64)), out=op((64, 64), ptr=(1 << 20) + 2))
    assert p.supported and not p.out_aligned


def test_an_output_no_kernel_can_write_falls_back():
    # a base between elements
    p = problem(op((64, 64)), op((64, 64)), out=op((64, 64), ptr=(1 << 20) + 1))
    assert codes(p) == ["alignment"] and "2-byte elements" in str(p.fallback_reason)


def test_size_one_dimensions_keep_their_strides_as_the_launcher_checks_them():
    # a (1, k) view taken from a wider matrix: its row stride is aligned
    p = problem(op((1, 64), stride=(1000, 1)), op((64, 64)))
    assert p.supported and p.a_major == "k"
    # ... or not: the launcher rejects a stride of 1001 elements even along a size-1 dimension
    assert codes(problem(op((1, 64), stride=(1001, 1)), op((64, 64)))) == ["alignment"]
    # a single column of b is K-major, but its one-element row stride is not 16 bytes
    p = problem(op((64, 64)), op((64, 1), stride=(1, 1)), out=op((64, 1), stride=(1, 8)))
    assert p.b_major == "k" and codes(p) == ["alignment"]


def test_a_narrow_product_of_a_sliced_matrix_falls_back():
    """tuned_gemm(a, b) with a a 39x152 view of a wider buffer and b 152x1 reached the
    launcher, which refused the output's row stride of one element."""
    p = problem(op((39, 152), stride=(160, 1)), op((152, 1)))
    # b's one-element rows; out's are written by direct stores
    assert codes(p) == ["alignment"] and "b's stride 1 " in str(p.fallback_reason)
    assert not p.out_aligned
    assert problem(op((39, 152), stride=(160, 1)), op((152, 8))).supported


# --- the fallback itself computes the right answer ----------------------------------------------


@pytest.mark.parametrize(
    ("ashape", "bshape"),
    [((0, 8), (8, 5)), ((4, 0), (0, 5)), ((4, 8), (8, 0)), ((2, 0, 3), (2, 3, 4))],
)
def test_fallback_matmul_zero_size(ashape, bshape):
    a, b = torch.randn(ashape), torch.randn(bshape)
    out = fallback_matmul(a, b)
    assert out.shape == torch.matmul(a, b).shape
    assert torch.count_nonzero(out) == 0


def test_fallback_matmul_honours_out_and_out_dtype():
    a = torch.randn(16, 32, dtype=torch.bfloat16)
    b = torch.randn(32, 8, dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    wide = fallback_matmul(a, b, out_dtype=torch.float32)
    assert wide.dtype == torch.float32
    torch.testing.assert_close(wide, ref, rtol=1e-5, atol=1e-5)
    out = torch.full((16, 8), float("nan"), dtype=torch.bfloat16)
    assert fallback_matmul(a, b, out=out) is out
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("m", "k", "n"), [(1, 64, 48), (16, 60, 50), (40, 64, 64), (20, 3000, 2100)]
)
def test_integer_matmul_is_exact_where_torch_int_mm_refuses_the_sizes(m, k, n):
    """int8 products go to torch._int_mm on zero-padded copies where its sizes need it (m above
    16, k and n multiples of 8), and stay exact."""
    from gemmtune.core.problem import integer_matmul

    gen = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen).t()
    product = integer_matmul(a, b)
    assert product.dtype == torch.int32 and product.is_contiguous()
    assert torch.equal(product, a.int() @ b.int())


def test_integer_matmul_of_column_major_a_keeps_the_problems_shape():
    """A column-major a needs the padded copies too (found by the fuzz: the exact path was
    handed the padded operands and returned their product's shape)."""
    from gemmtune.core.problem import integer_matmul

    a = torch.randint(-128, 128, (832, 23), dtype=torch.int8).t()  # 23 x 832, column-major
    b = torch.randint(-128, 128, (832, 1), dtype=torch.int8)
    assert torch.equal(integer_matmul(a, b), a.int() @ b.int())
