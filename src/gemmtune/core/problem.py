"""What is being multiplied: `GemmProblem`, and why a problem cannot be served by our kernels.

Conventions. `out = a @ b` with `a` of shape (m, k) or (l, m, k) and `b` of shape (k, n) or
(l, k, n). Our kernels see A as (M, K, L), B as (N, K, L) and the output as (M, N, L), so the
*major* (contiguous) mode of each operand is named the way the kernels name it: A is "k"-major
when a row of `a` is contiguous (row-major `a`), B is "n"-major when `b` is row-major and "k"-major
when `b` is column-major, the output is "n"-major when row-major.

Two kinds of trouble are kept apart:
- a call that is wrong (mismatched shapes, operands on two devices, int32 inputs...) raises a clear
  `ValueError` or `TypeError` naming the argument, exactly where torch.matmul would also fail or
  where we refuse to guess;
- a call that is legal but that our kernels do not serve (odd strides, misalignment, zero-size
  dimensions, float32 inputs, another GPU, tensors off the GPU) yields `FallbackReason`s; the
  caller then uses `torch.matmul`, which gives the right answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gemmtune.core import dtypes
from gemmtune.core.device import Arch, arch_of, device_info
from gemmtune.core.dtypes import ALIGNMENT_BYTES

#: Input dtypes our kernels multiply (A and B match, or are two fp8 types), and the output
#: dtypes they write.
KERNEL_INPUT_DTYPES = tuple(map(dtypes.torch_dtype, dtypes.KERNEL_INPUTS))
FP8_DTYPES = tuple(map(dtypes.torch_dtype, dtypes.FP8))
EIGHT_BIT_DTYPES = tuple(map(dtypes.torch_dtype, dtypes.EIGHT_BIT))
KERNEL_OUTPUT_DTYPES = tuple(map(dtypes.torch_dtype, dtypes.KERNEL_OUTPUTS))
#: Floating dtypes torch.matmul multiplies on a GPU that we hand back to it.
FALLBACK_INPUT_DTYPES = (torch.float32, torch.float64)
#: What a product of int8 inputs is written as (exactly, as `torch._int_mm` does)
INT8_OUTPUT_DTYPES = (torch.int32,)
#: torch._int_mm multiplies matrices of more rows than this only
INT_MM_MIN_ROWS = 17
#: What a product of floating inputs may be written as
FLOAT_OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
#: What a product of fp8 inputs may be written as
FP8_OUTPUT_DTYPES = tuple(map(dtypes.torch_dtype, dtypes.OUTPUTS_OF[dtypes.FP8[0]]))


@dataclass(frozen=True)
class FallbackReason:
    """Why our kernels cannot serve a legal problem. `code` is stable; `detail` is for people."""

    code: str
    detail: str

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


def _major_of(rows: int, cols: int, row_stride: int, col_stride: int) -> str | None:
    """ "row" if a row is contiguous, "col" if a column is, None if neither.

    A dimension of size 1 has no meaningful stride, so a matrix with one row or one column is
    contiguous along its other dimension whatever that dimension's stride is.
    """
    if cols > 1 and col_stride == 1 and (rows == 1 or row_stride >= cols):
        return "row"
    if rows > 1 and row_stride == 1 and (cols == 1 or col_stride >= rows):
        return "col"
    if cols <= 1:
        return "row"
    if rows <= 1:
        return "col"
    return None


def default_out_dtype(dtype: torch.dtype) -> torch.dtype:
    """What `a @ b` of `dtype` inputs is written as without an out_dtype: the input type,
    int32 for int8 (exact, as torch._int_mm writes it), bf16 for fp8."""
    if dtype == torch.int8:
        return torch.int32
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a row-major (C-contiguous) tensor of `shape`."""
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


@dataclass(frozen=True)
class Operand:
    """The facts about one tensor that decide how it is multiplied (no reference to its data)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    data_ptr: int

    @classmethod
    def of(cls, t: object, name: str) -> Operand:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.data_ptr())

    @property
    def element_size(self) -> int:
        return self.dtype.itemsize

    def misalignment(self, name: str, major: str) -> str | None:
        """Why a kernel cannot take this operand laid out with its `major` ("row": a row is
        contiguous, "col": a column is) as given, or None. TMA needs a 16-byte aligned base,
        a contiguous stride of exactly 1, and every other stride a multiple of 16 bytes; the
        launcher checks the strides as they are, those of dimensions of size 1 included."""
        if why := self.element_misalignment(name, major):
            return why
        if not self.pointer_aligned:
            return f"{name}'s data pointer is not {ALIGNMENT_BYTES}-byte aligned"
        contiguous = self._contiguous_dim(major)
        for dim, stride in enumerate(self.stride):
            if dim != contiguous and (stride * self.element_size) % ALIGNMENT_BYTES:
                return (
                    f"{name}'s stride {stride} along dim {dim} is {stride * self.element_size} "
                    f"bytes, not a multiple of {ALIGNMENT_BYTES}"
                )
        return None

    @property
    def pointer_aligned(self) -> bool:
        """Whether the base address suits TMA (16-byte aligned)."""
        return self.data_ptr % ALIGNMENT_BYTES == 0

    def element_misalignment(self, name: str, major: str) -> str | None:
        """Why no kernel can address this operand laid out with its `major`, not even one that
        stores element by element: its contiguous dimension must have stride 1 and its base be
        aligned to its element."""
        contiguous = self._contiguous_dim(major)
        if self.stride[contiguous] != 1:
            stride = self.stride[contiguous]
            return f"{name}'s contiguous dimension {contiguous} has stride {stride}"
        if self.data_ptr % self.element_size:
            return f"{name}'s data pointer is not aligned to its {self.element_size}-byte elements"
        return None

    def _contiguous_dim(self, major: str) -> int:
        return len(self.stride) - (1 if major == "row" else 2)

    def check(self, name: str) -> None:
        """Raise for an operand no GEMM can take."""
        if len(self.shape) not in (2, 3):
            raise ValueError(
                f"{name} must be 2-D or 3-D (a batch of matrices), got {len(self.shape)}-D with "
                f"shape {self.shape}"
            )
        if self.dtype not in KERNEL_INPUT_DTYPES + FALLBACK_INPUT_DTYPES:
            raise TypeError(
                f"{name} has dtype {self.dtype}; gemmtune multiplies bfloat16, float16, int8 and "
                "fp8 (float8_e4m3fn, float8_e5m2) tensors on its kernels, float32 and float64 "
                "through torch.matmul"
            )


@dataclass(frozen=True)
class GemmProblem:
    """One `out = a @ b`: sizes, dtypes, layouts and device, and whether our kernels serve it."""

    m: int
    n: int
    k: int
    l: int
    a_dtype: torch.dtype
    b_dtype: torch.dtype
    out_dtype: torch.dtype
    a_major: str | None  # "k" | "m" | None
    b_major: str | None  # "k" | "n" | None
    out_major: str | None  # "n" | "m" | None
    batched: bool
    device: torch.device
    arch: Arch
    fallback_reasons: tuple[FallbackReason, ...] = field(default=())
    #: fp8 only: how the product is scaled, "tensor" or "row" (`dtypes.SCALINGS`); a
    #: product without scales (tuned_gemm's) is scaled by one per tensor
    scaling: str = ""
    #: fp8 only: partial sums promoted into fp32 every 128 elements of K (torch._scaled_mm
    #: without use_fast_accum), rather than accumulated on the tensor cores
    promoted: bool = False
    #: whether the output suits TMA (16-byte aligned base and strides): an output that does not
    #: (a row of 2,100 bf16 values is 4,200 bytes) is written by direct stores only
    out_aligned: bool = True
    #: the operands ("a", "b") our kernels multiply as K-major copies made on every call, each
    #: given in the other major (a column-major, b row-major): 8-bit inputs, which 8-bit MMAs
    #: cannot read so, and 16-bit ones whose strides TMA cannot take (`kernels.transpose`);
    #: `a_major` and `b_major` are the copies' ("k")
    copied: tuple[str, ...] = ()
    #: a bias, one element per column of the output in its type, is added to the product
    #: (`KernelSignature.bias`)
    bias: bool = False

    @property
    def supported(self) -> bool:
        """True when one of our kernels can compute this problem."""
        return not self.fallback_reasons

    @property
    def fallback_reason(self) -> FallbackReason | None:
        """The first reason to fall back to torch.matmul, or None when we serve the problem."""
        return self.fallback_reasons[0] if self.fallback_reasons else None

    @property
    def layout(self) -> str:
        """BLAS-style layout name of the operands as given, A then B, "t" meaning K-major:
        row-major a @ b is "tn"."""
        a = "t" if self.a_major == "k" and "a" not in self.copied else "n"
        b = "t" if self.b_major == "k" and "b" not in self.copied else "n"
        return a + b

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.l

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.l, self.m, self.n) if self.batched else (self.m, self.n)

    @property
    def out_stride(self) -> tuple[int, ...]:
        """The strides of a contiguous output, as tuned_gemm allocates one."""
        return contiguous_strides(self.out_shape)

    @classmethod
    def from_tensors(
        cls,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        scaling: str | None = None,
        promoted: bool = False,
        bias: bool = False,
    ) -> GemmProblem:
        """Describe `a @ b` (written into `out` when given); raise for calls that are wrong.
        `scaling` is an fp8 product's ("tensor" where not given), `promoted` whether its
        partial sums are promoted into fp32, `bias` whether a bias is added."""
        return cls.from_operands(
            Operand.of(a, "a"),
            Operand.of(b, "b"),
            None if out is None else Operand.of(out, "out"),
            out_dtype,
            scaling=scaling,
            promoted=promoted,
            bias=bias,
        )

    @classmethod
    def of_shape(
        cls,
        m: int,
        n: int,
        k: int,
        l: int | None = None,
        *,
        dtype: torch.dtype = torch.bfloat16,
        out_dtype: torch.dtype | None = None,
        layout: str = "tn",
        out_major: str = "n",
        device: torch.device | int | str = "cuda",
        arch: Arch | None = None,
        b_dtype: torch.dtype | None = None,
        scaling: str | None = None,
        promoted: bool = False,
        bias: bool = False,
    ) -> GemmProblem:
        """The problem of `a @ b` for dense tensors of these sizes, without the tensors (to tune
        ahead of time): `layout` names A then B, "t" for K-major (row-major a @ b is "tn"),
        `out_major` "n" for a row-major output; `l` makes it a batch of `l` products; `b_dtype`
        is B's type where it differs from `dtype` (fp8), `scaling` and `promoted` an fp8
        product's; `bias` adds a bias to each column."""
        if len(layout) != 2 or set(layout) - {"t", "n"}:
            raise ValueError(f"layout {layout!r}: use tn, nn, nt or tt (A then B, t = K-major)")
        if out_major not in ("n", "m"):
            raise ValueError(f"out_major {out_major!r}: use n (row-major) or m (column-major)")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device() if arch is None else 0)
        lead = () if l is None else (l,)

        def operand(rows: int, cols: int, rows_contiguous: bool, dt: torch.dtype) -> Operand:
            stride = (1, rows) if rows_contiguous else (cols, 1)
            batch = (rows * cols,) if lead else ()
            return Operand((*lead, rows, cols), (*batch, *stride), dt, device, 1 << 20)

        a = operand(m, k, layout[0] == "n", dtype)
        b = operand(k, n, layout[1] == "t", b_dtype or dtype)
        out_dtype = out_dtype or default_out_dtype(dtype)
        out = operand(m, n, out_major == "m", out_dtype)
        return cls.from_operands(
            a, b, out, arch=arch, scaling=scaling, promoted=promoted, bias=bias
        )

    @classmethod
    def from_operands(
        cls,
        a: Operand,
        b: Operand,
        out: Operand | None = None,
        out_dtype: torch.dtype | None = None,
        arch: Arch | None = None,
        scaling: str | None = None,
        promoted: bool = False,
        bias: bool = False,
    ) -> GemmProblem:
        """`from_tensors` on tensor descriptions; `arch` overrides the device's (for tests)."""
        a.check("a")
        b.check("b")
        if a.device != b.device:
            raise ValueError(f"a is on {a.device} but b is on {b.device}; they must share a device")
        fp8 = a.dtype in FP8_DTYPES
        if a.dtype != b.dtype and not (fp8 and b.dtype in FP8_DTYPES):
            raise TypeError(
                f"a has dtype {a.dtype} but b has {b.dtype}; they must match (or be two fp8 types)"
            )
        if fp8:
            scaling = scaling or "tensor"
            if scaling not in dtypes.SCALINGS:
                raise ValueError(f"scaling {scaling!r}: use one of {', '.join(dtypes.SCALINGS)}")
        elif scaling or promoted:
            raise ValueError(
                f"scaling {scaling!r} and promoted={promoted} are for fp8 inputs; a and b are "
                f"{a.dtype}"
            )
        k = a.shape[-1]
        if b.shape[-2] != k:
            raise ValueError(
                f"inner dimensions differ: a has shape {a.shape} (k={k}) but b has shape "
                f"{b.shape} (k={b.shape[-2]})"
            )
        m, n = a.shape[-2], b.shape[-1]
        reasons: list[FallbackReason] = []

        batched = len(a.shape) == 3 or len(b.shape) == 3
        la = a.shape[0] if len(a.shape) == 3 else None
        lb = b.shape[0] if len(b.shape) == 3 else None
        if la is not None and lb is not None and la != lb:
            if 1 not in (la, lb):
                raise ValueError(f"batch sizes differ: a has {la} matrices, b has {lb}")
            reasons.append(FallbackReason("broadcast", f"batch broadcast {la} against {lb}"))
        elif (la is None) != (lb is None):
            reasons.append(
                FallbackReason("broadcast", "a 3-D operand against a 2-D one broadcasts the batch")
            )
        # broadcasting a batch of one against a batch of any size, zero included, gives that size
        l = next((x for x in (la, lb) if x is not None and x != 1), 1)

        integer = a.dtype == torch.int8
        if integer and bias:
            raise TypeError("int8 products (torch._int_mm) take no bias")
        all_output_dtypes = INT8_OUTPUT_DTYPES if integer else FLOAT_OUTPUT_DTYPES
        allowed = "int32 for int8 inputs" if integer else "bfloat16, float16 or float32"
        if fp8:
            all_output_dtypes = FP8_OUTPUT_DTYPES
        if out_dtype is not None and out_dtype not in all_output_dtypes:
            raise TypeError(f"out_dtype {out_dtype} is not supported; use {allowed}")
        expected_shape = (l, m, n) if batched else (m, n)
        if out is not None:
            if out.shape != expected_shape:
                raise ValueError(f"out has shape {out.shape}, expected {expected_shape} for a @ b")
            if out.device != a.device:
                raise ValueError(f"out is on {out.device} but a and b are on {a.device}")
            if out_dtype is not None and out.dtype != out_dtype:
                raise TypeError(f"out has dtype {out.dtype} but out_dtype is {out_dtype}")
            if out.dtype not in all_output_dtypes:
                raise TypeError(f"out has dtype {out.dtype}; use {allowed}")
            out_dtype = out.dtype
        out_dtype = out_dtype or default_out_dtype(a.dtype)

        on_gpu = a.device.type == "cuda"
        if not on_gpu:  # torch.matmul multiplies them where they are
            arch = Arch.OTHER
            where = f"tensors on {a.device.type}: gemmtune's kernels run on GPUs"
            reasons.append(FallbackReason("device", where))
        elif arch is None:
            arch = arch_of(a.device.index or 0)
        if on_gpu and not arch.has_kernels:
            reasons.append(
                FallbackReason(
                    "arch", f"{_gpu_label(a.device)}: gemmtune kernels run on sm_90 and sm_100 GPUs"
                )
            )
        if a.dtype not in KERNEL_INPUT_DTYPES:
            reasons.append(
                FallbackReason("dtype", f"inputs are {a.dtype}; kernels take bf16, fp16, int8, fp8")
            )
        if fp8 and promoted and arch is Arch.SM100:
            # the Hopper kernel promotes partial sums into registers of fp32 every 128 elements of
            # K; the Blackwell kernel has no such path, so it takes fast accumulation only
            reasons.append(
                FallbackReason("dtype", "promoted fp8 accumulation runs on the Hopper kernel only")
            )
        if bias and arch is not Arch.SM90:
            reasons.append(FallbackReason("bias", "the Hopper kernel alone adds a bias"))
        if out_dtype not in KERNEL_OUTPUT_DTYPES:
            reasons.append(FallbackReason("dtype", f"kernels do not write {out_dtype} output"))
        if 0 in (m, n, k, l):
            reasons.append(FallbackReason("zero_size", f"empty problem m={m} n={n} k={k} l={l}"))

        if out is None:  # tuned_gemm allocates it contiguous, at an aligned address
            stride = contiguous_strides(expected_shape)
            out = Operand(expected_shape, stride, out_dtype, a.device, 0)
        majors = {
            name: _major_of(rows, cols, *op.stride[-2:])
            for name, op, rows, cols in (("a", a, m, k), ("b", b, k, n), ("out", out, m, n))
        }
        # 8-bit MMAs read A and B K-major: an operand in the other layout is copied K-major
        # (`kernels.transpose`), so its own strides do not matter. So is a 16-bit one whose
        # strides TMA cannot take (`x @ w` of a weight with rows of 4,200 bytes), at an address
        # TMA can: the copy's are padded. Its address stays a condition, so that a plan made for
        # these strides (`api.dispatch`) copies only where every call with them must.
        eight_bit = a.dtype in EIGHT_BIT_DTYPES
        other_major = {"a": "col", "b": "row"}
        copied = tuple(
            name
            for name, op in (("a", a), ("b", b))
            if majors[name] == other_major[name]
            and (eight_bit or (op.misalignment(name, majors[name]) and op.pointer_aligned))
        )
        out_aligned = True
        for name, op in (("a", a), ("b", b), ("out", out)):
            if majors[name] is None:
                reasons.append(
                    FallbackReason(
                        "layout", f"{name} has strides {op.stride}: neither dimension is contiguous"
                    )
                )
            elif name in copied:
                continue
            elif why := op.misalignment(name, majors[name]):
                # the output need not suit TMA: kernels with direct stores write it anywhere
                # its elements are aligned
                if name == "out" and op.element_misalignment(name, majors[name]) is None:
                    out_aligned = False
                else:
                    reasons.append(FallbackReason("alignment", why))
        a_major = "k" if "a" in copied else {"row": "k", "col": "m"}.get(majors["a"])
        b_major = "k" if "b" in copied else {"row": "n", "col": "k"}.get(majors["b"])
        out_major = {"row": "n", "col": "m"}.get(majors["out"])

        return cls(
            m=m,
            n=n,
            k=k,
            l=l,
            a_dtype=a.dtype,
            b_dtype=b.dtype,
            out_dtype=out_dtype,
            a_major=a_major,
            b_major=b_major,
            out_major=out_major,
            batched=batched,
            device=a.device,
            arch=arch,
            fallback_reasons=tuple(reasons),
            scaling=scaling or "",
            promoted=promoted,
            out_aligned=out_aligned,
            copied=copied,
            bias=bias,
        )


def _gpu_label(device: torch.device) -> str:
    if device.type != "cuda" or not torch.cuda.is_available():
        return str(device)
    info = device_info(device.index or 0)
    return f"{info.name} ({info.sm_label})"


def fallback_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`a @ b` through torch.matmul, honouring `out` and `out_dtype` (zero-size included); int8
    products through `integer_matmul`, fp8 ones (unscaled) in float32."""
    want = out.dtype if out is not None else (out_dtype or default_out_dtype(a.dtype))
    if a.dtype in FP8_DTYPES:  # CUDA's matmul has no fp8 kernels; fp8 values are exact in fp32
        result = torch.matmul(a.float(), b.float()).to(want)
    elif a.dtype == torch.int8:  # int8 products are int32, the one output they have
        result = integer_matmul(a, b)
    else:
        result = torch.matmul(a, b)
    if result.dtype != want:
        # torch.matmul accumulates in fp32 and rounds to the input dtype; a wider output should
        # not inherit that rounding, so recompute in the output's precision.
        wide = torch.promote_types(want, torch.float32)
        result = torch.matmul(a.to(wide), b.to(wide)).to(want)
    if out is None:
        return result
    out.copy_(result)
    return out


def integer_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The exact int32 product of int8 `a` and `b` (CUDA's matmul has no integer kernels):
    `torch._int_mm` for matrices, on zero-padded copies (a row-major, b column-major, the
    layout cuBLASLt's int8 GEMM takes) where its sizes need them (m above 16, k and n multiples
    of 8: what a user of torch._int_mm does), else in float64, whose 53-bit mantissa holds every
    sum of int8 products exactly for any K a GPU holds."""
    if a.dim() == b.dim() == 2 and a.numel() and b.numel():
        (m, k), n = a.shape, b.shape[1]
        rows, depth, cols = max(m, INT_MM_MIN_ROWS), -(-k // 8) * 8, -(-n // 8) * 8
        x, y = a, b
        if (rows, depth, cols) != (m, k, n):
            x = a.new_zeros((rows, depth))
            x[:m, :k] = a
            y = b.new_zeros((cols, depth)).t()
            y[:k, :n] = b
        try:
            product = torch._int_mm(x, y)
        except RuntimeError:  # a layout cuBLASLt refuses: the exact path below takes it
            pass
        else:
            return product if (rows, cols) == (m, n) else product[:m, :n].contiguous()
    return torch.matmul(a.double(), b.double()).to(torch.int32)


def scaled_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
    use_fast_accum: bool = True,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """torch's scaled product of fp8 `a` and `b` (plus `bias`), with or without fast
    accumulation as our kernel accumulates (promoted or not): `torch._scaled_mm` where it takes
    the call, else the float32 product of the operands, scaled."""
    options = {"out_dtype": out_dtype, "use_fast_accum": use_fast_accum, "bias": bias}
    try:
        return torch._scaled_mm(a, b, scale_a, scale_b, **options)
    except RuntimeError:  # sizes or a scaling cuBLASLt refuses: float32 takes them
        product = scaled_reference(a, b, scale_a, scale_b)
        return (product if bias is None else product + bias.float()).to(out_dtype)


def declined_by_cublas(error: BaseException) -> bool:
    """Whether `error` is cuBLAS(Lt) finding no algorithm for a call torch has checked and
    accepted (`CUBLAS_STATUS_NOT_SUPPORTED`: `torch._scaled_mm` of some sizes with per-row
    scales and a bias, say), not a wrong argument: the call is valid, and our kernels may serve
    it."""
    return isinstance(error, RuntimeError) and "CUBLAS_STATUS_NOT_SUPPORTED" in str(error)


def scaled_reference(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor
) -> torch.Tensor:
    """The float32 product of fp8 `a` and `b` scaled by `scale_a` (one element, or (m, 1)) and
    `scale_b` (one element, or (1, n)): every fp8 value is exact in float32."""
    return torch.matmul(a.float(), b.float()) * scale_a * scale_b
