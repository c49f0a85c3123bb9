"""Random calls of `tuned_gemm` for the fuzz test: a case is plain data (sizes, dtypes, layouts,
slicing, offsets, `out`, `out_dtype` and a bias), drawn from a seed, and `make_tensors` and
`make_bias` build its tensors on any device, so the CPU tests check what the generator covers
and the GPU test runs the same cases.

int8 cases (exact int32 results) and fp8 cases (e4m3, e5m2: tuned_gemm multiplies them with
unit scales) are drawn beside bf16 and fp16. Sizes mix the ones users meet (tile multiples,
ragged, 1) with random ones from 1 to a few thousand; most contiguous extents are padded to 16
bytes so that enough cases reach our kernels rather than torch, and half the 8-bit cases have
the one layout 8-bit MMAs read (a row-major, b column-major); the others, any layout, run on
K-major copies of the operands in the other one."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from gemmtune.measure.verify import INTEGER_POISON

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
DTYPES = (torch.bfloat16, torch.float16, torch.int8, *FP8)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: what the product of int8 inputs is written as
INT8_OUT = torch.int32
#: the biases a case may add (`tuned_gemm(..., bias=)`): one per column in the result's type,
#: contiguous (the one our kernel adds), the same every other element of a wider buffer, an
#: (m, n) matrix, and one per column of another type (float32, or bf16 beside a float32 result);
#: int8 cases draw int32 ones
BIASES = ("vector", "strided", "matrix", "other")

#: allowed |out - reference| per element: a few roundings of the output type relative to the
#: element, plus an absolute term for sums rounded on the way. Entries of a product of randn
#: matrices, and its partial sums, grow like sqrt(K), and cuBLAS (which serves what our kernels
#: do not) may reduce split-K partials in the output type.
RTOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}
EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10, torch.float32: 2.0**-23}
PARTIAL_ROUNDINGS = 4
#: the rounding of the partial sums an fp8 product's accumulators keep on the tensor cores
#: (fewer bits than fp32's), in place of 2**-13 in the absolute term
FP8_PARTIAL_EPS = 2.0**-9
#: ... and truncated at each addition, so that an element's error follows the sum of its
#: |a_i * b_i| rather than the square root of k: an fp8 element may also lie within this
#: fraction of that sum. On an H200, torch._scaled_mm with `use_fast_accum` (cuBLAS) erred on
#: fuzz cases to the bit as our kernels did (1217 x 128 x 2544 e4m3 into fp32: 0.764 at most,
#: 47 elements beyond the square-root term; its promoted product 0.044, none).
FP8_ACCUMULATION_EPS = 2.0**-9


@dataclass(frozen=True)
class Operand:
    """How one matrix is laid out: its rows x cols, which mode is contiguous, how much wider
    than its width its buffer's rows are (sliced rows), and how many elements precede it."""

    rows: int
    cols: int
    row_major: bool
    pad: int  # extra elements per contiguous line: a view of a wider buffer
    offset: int  # leading elements of the storage before the view


@dataclass(frozen=True)
class FuzzCase:
    m: int
    n: int
    k: int
    batch: int  # 0: 2-D operands
    dtype: torch.dtype
    a: Operand
    b: Operand
    out: Operand | None  # None: tuned_gemm allocates it
    out_dtype: torch.dtype | None  # `out`'s dtype where there is one, else passed as out_dtype=
    seed: int
    bias: str | None = None  # one of `BIASES`, None: no bias

    @property
    def result_dtype(self) -> torch.dtype:
        from gemmtune.core.problem import default_out_dtype

        return self.out_dtype or default_out_dtype(self.dtype)

    def describe(self) -> str:
        parts = [f"{self.m}x{self.n}x{self.k}", f"batch={self.batch}", str(self.dtype)]
        for name in ("a", "b", "out"):
            op = getattr(self, name)
            if op is not None:
                major = "row" if op.row_major else "col"
                parts.append(f"{name}:{major},pad={op.pad},offset={op.offset}")
        parts.append(f"out_dtype={self.out_dtype}")
        if self.bias is not None:
            parts.append(f"bias={self.bias}")
        return " ".join(parts)


def _extent(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.1:
        return 1
    if kind < 0.25:
        return rng.randint(2, 16)
    if kind < 0.45:
        return 64 * rng.randint(1, 24) + rng.choice((0, 0, 8, -8, 1))  # near a tile multiple
    return max(1, int(math.exp(rng.uniform(0, math.log(3000)))))


def _operand(
    rng: random.Random, rows: int, cols: int, itemsize: int = 2, row_major: bool | None = None
) -> Operand:
    if row_major is None:
        row_major = rng.random() < 0.6
    width = cols if row_major else rows
    pad = 0
    if rng.random() < 0.85:
        pad = -width % (16 // itemsize)  # rows padded to 16 bytes: widths our kernels take
    if rng.random() < 0.25:
        pad += rng.choice((8, 16, 24, 8, 16, 3))  # sliced out of a wider buffer
    # 16 and 128 bytes in (aligned), or one element (misaligned: torch serves such an a or b,
    # kernels storing directly such an out)
    offset = rng.choice((16 // itemsize, 128 // itemsize, 1)) if rng.random() < 0.2 else 0
    return Operand(rows, cols, row_major, pad, offset)


def draw(seed: int) -> FuzzCase:
    """The case of `seed`: the same on every machine."""
    rng = random.Random(seed)
    m, n, k = _extent(rng), _extent(rng), _extent(rng)
    batch = rng.choice((2, 3, 4)) if rng.random() < 0.2 else 0
    dtype = rng.choice(DTYPES)
    a_row_major = b_row_major = None
    if dtype.itemsize == 1 and rng.random() < 0.5:  # the layout 8-bit MMAs read
        a_row_major, b_row_major = True, False
    a = _operand(rng, m, k, dtype.itemsize, a_row_major)
    b = _operand(rng, k, n, dtype.itemsize, b_row_major)
    out = out_dtype = None
    out_dtypes = (INT8_OUT,) if dtype == torch.int8 else OUT_DTYPES
    roll = rng.random()
    if roll < 0.35:
        out_dtype = rng.choice(out_dtypes)
    elif roll < 0.7:
        out = _operand(rng, m, n)
        if rng.random() < 0.5:
            out_dtype = rng.choice(out_dtypes)  # the dtype `out` is allocated with
    bias = None  # drawn last: the cases of earlier seeds keep what they drew before
    if rng.random() < 0.3:
        bias = rng.choice(("vector", "vector", *BIASES))
        if dtype == torch.int8 and bias == "other":
            bias = "vector"
    return FuzzCase(m, n, k, batch, dtype, a, b, out, out_dtype, seed, bias)


def _tensor(op: Operand, batch: int, dtype, device, fill: str, generator=None) -> torch.Tensor:
    lead, line = (op.rows, op.cols) if op.row_major else (op.cols, op.rows)
    per_matrix = lead * (line + op.pad)
    count = max(batch, 1)
    storage = torch.empty(op.offset + count * per_matrix, dtype=dtype, device=device)
    integer = not storage.is_floating_point()
    if fill == "randn":
        if integer:
            storage.random_(-128, 128, generator=generator)
        elif dtype in FP8:  # torch draws no fp8 directly: randn rounded to it
            storage.copy_(torch.empty(storage.shape, device=device).normal_(generator=generator))
        else:
            storage.normal_(generator=generator)
    elif fill == "nan":
        storage.fill_(INTEGER_POISON if integer else math.nan)
    view = storage[op.offset :].view(count, lead, line + op.pad)[:, :, :line]
    if not op.row_major:
        view = view.transpose(1, 2)
    return view if batch else view[0]


def make_tensors(
    case: FuzzCase, device, *, data: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(a, b, out) of `case` on `device`: randn operands (uninitialised without `data`: enough
    to plan the call), `out` (if any) all NaN."""
    fill = "randn" if data else "none"
    generator = torch.Generator(device=device).manual_seed(case.seed)
    a = _tensor(case.a, case.batch, case.dtype, device, fill, generator)
    b = _tensor(case.b, case.batch, case.dtype, device, fill, generator)
    out = None
    if case.out is not None:
        out = _tensor(case.out, case.batch, case.result_dtype, device, "nan")
    return a, b, out


def make_bias(case: FuzzCase, device) -> torch.Tensor | None:
    """`case`'s bias on `device` (None without one): randn times the square root of k, as large
    as the product's elements (int32: uniform in +-2^20)."""
    if case.bias is None:
        return None
    dtype = case.result_dtype
    if case.bias == "other":
        dtype = torch.bfloat16 if dtype == torch.float32 else torch.float32
    shape = {"vector": (case.n,), "strided": (2 * case.n,), "matrix": (case.m, case.n),
             "other": (case.n,)}[case.bias]  # fmt: skip
    generator = torch.Generator(device=device).manual_seed(case.seed + 1)
    if dtype == INT8_OUT:
        bias = torch.randint(-(2**20), 2**20, shape, generator=generator, device=device,
                             dtype=dtype)  # fmt: skip
    else:
        bias = torch.randn(shape, generator=generator, device=device) * math.sqrt(case.k)
        bias = bias.to(dtype)
    return bias[::2] if case.bias == "strided" else bias


def mismatches(
    got: torch.Tensor,
    reference: torch.Tensor,
    k: int,
    fp8: bool = False,
    magnitude: torch.Tensor | None = None,
) -> int:
    """How many elements of `got` lie outside the tolerance of the float32 `reference` (NaN and
    Inf count as outside), for a product of fp8 inputs where `fp8` (`magnitude`: |a| @ |b|,
    for `FP8_ACCUMULATION_EPS`); of an integer `got`, how many differ from the exact
    `reference`."""
    if not got.is_floating_point():
        return int((got != reference.to(got.dtype)).sum())
    partial_eps = FP8_PARTIAL_EPS if fp8 else 2.0**-13
    atol = PARTIAL_ROUNDINGS * max(EPS[got.dtype], partial_eps) * math.sqrt(max(k, 1))
    allowed = RTOL[got.dtype] * reference.abs() + atol
    if fp8 and magnitude is not None:
        allowed = torch.maximum(allowed, FP8_ACCUMULATION_EPS * magnitude)
    bad = ~((got.float() - reference).abs() <= allowed)
    return int(bad.sum())
