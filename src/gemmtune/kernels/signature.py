"""`KernelSignature`: what a compiled kernel is specialised for besides its `GemmConfig`.

One binary serves every M, N, K and L; it is specific to the dtypes, to which mode of each
operand is contiguous, to whether the tensors carry a batch dimension (rank 2 or 3), and for
fp8 to how the product is scaled (a binary of a scaled signature takes two more tensors, the
scales, after a, b and out), and to whether it adds a bias (one more tensor, after those).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gemmtune.core import dtypes

if TYPE_CHECKING:
    from gemmtune.core.problem import GemmProblem

# In the transposed product out^T = b^T @ a^T, the major of the new A (from b's), of the new B
# (from a's) and of the output: a contiguous K stays K, b's contiguous N is b^T's M, a's
# contiguous M is a^T's N.
_SWAPPED_A_MAJOR = {"k": "k", "n": "m"}
_SWAPPED_B_MAJOR = {"k": "k", "m": "n"}
_SWAPPED_OUT_MAJOR = {"n": "m", "m": "n"}


@dataclass(frozen=True)
class KernelSignature:
    """Dtypes (by short name), majors and rank of the tensors a kernel is compiled for, and
    the scaling of an fp8 product."""

    ab_dtype: str = "bf16"  # A's, and B's unless `b_dtype` names another
    out_dtype: str = "bf16"
    a_major: str = "k"  # "k" | "m"
    b_major: str = "n"  # "k" | "n"
    out_major: str = "n"  # "n" | "m"
    batched: bool = False
    b_dtype: str = ""  # B's where it differs from A's (fp8: e4m3 with e5m2)
    scaling: str = ""  # fp8 only: "tensor" | "row" (`dtypes.SCALINGS`)
    #: fp8 only: add the partial sums of every 128 elements of K into fp32 accumulators
    #: ("promotion", what torch._scaled_mm does without use_fast_accum) rather than accumulate
    #: on the tensor cores, which keep fewer bits
    promoted: bool = False
    #: the output suits TMA (16-byte aligned base and strides); a binary for an output that does
    #: not assumes only element alignment and stores directly
    out_aligned: bool = True
    #: b is not written by the kernel launched before ours on the stream (a layer's weight
    #: during inference): a Hopper binary loads its first stages of b before waiting for that
    #: kernel to finish. Blackwell binaries ignore it.
    constant_b: bool = False
    #: the kernel adds a bias, one element per column of the output in its type, to the product
    #: (scaled, for fp8) before it rounds it to the output type: `torch.addmm`, a linear layer
    #: with a bias, `torch._scaled_mm(..., bias=)`
    bias: bool = False

    def __post_init__(self) -> None:
        if self.ab_dtype not in dtypes.KERNEL_INPUTS:
            inputs = ", ".join(dtypes.KERNEL_INPUTS)
            raise ValueError(f"ab_dtype={self.ab_dtype!r}: kernels take {inputs} inputs")
        if self.b_dtype and (
            self.b_dtype == self.ab_dtype or not dtypes.inputs_pair(self.ab_dtype, self.b_dtype)
        ):
            raise ValueError(
                f"b_dtype={self.b_dtype!r}: only two different fp8 types mix, and b_dtype is "
                "left empty where B's type is A's"
            )
        if not (self.scaling in dtypes.SCALINGS if self.fp8 else self.scaling == ""):
            raise ValueError(
                f"scaling={self.scaling!r}: fp8 products are scaled by one of "
                f"{', '.join(dtypes.SCALINGS)}, other products not at all"
            )
        if self.promoted and not self.fp8:
            raise ValueError("promoted accumulation is for fp8 products only")
        if self.bias and self.ab_dtype == "int8":
            raise ValueError("int8 products (torch._int_mm) take no bias")
        outputs = dtypes.OUTPUTS_OF[self.ab_dtype]
        if self.out_dtype not in outputs:
            raise ValueError(
                f"out_dtype={self.out_dtype!r}: {self.ab_dtype} kernels write {', '.join(outputs)}"
            )
        for name, allowed in (("a_major", "km"), ("b_major", "kn"), ("out_major", "nm")):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be one of {list(allowed)}")
        if self.eight_bit and (self.a_major, self.b_major) != ("k", "k"):
            raise ValueError(f"{self.ab_dtype} kernels read A and B K-major (a_major=b_major='k')")

    @property
    def eight_bit(self) -> bool:
        """One-byte inputs: WGMMA reads both from shared memory K-major."""
        return self.ab_dtype in dtypes.EIGHT_BIT

    @property
    def fp8(self) -> bool:
        return self.ab_dtype in dtypes.FP8

    @property
    def b_input(self) -> str:
        """B's type."""
        return self.b_dtype or self.ab_dtype

    @property
    def ab_bytes(self) -> int:
        return dtypes.itemsize(self.ab_dtype)

    @classmethod
    def of(cls, problem: GemmProblem) -> KernelSignature:
        """The signature a supported problem needs."""
        a_dtype, b_dtype = dtypes.name_of(problem.a_dtype), dtypes.name_of(problem.b_dtype)
        return cls(
            ab_dtype=a_dtype,
            out_dtype=dtypes.name_of(problem.out_dtype),
            a_major=problem.a_major or "k",
            b_major=problem.b_major or "n",
            out_major=problem.out_major or "n",
            batched=problem.batched,
            b_dtype="" if b_dtype == a_dtype else b_dtype,
            scaling=problem.scaling,
            promoted=problem.promoted,
            out_aligned=problem.out_aligned,
            bias=problem.bias,
        )

    def swapped(self) -> KernelSignature:
        """The signature of the transposed product out^T = b^T @ a^T, the one a `swap_ab`
        config's binary is compiled for."""
        return dataclasses.replace(
            self,
            ab_dtype=self.b_input,
            b_dtype=self.ab_dtype if self.b_dtype else "",
            a_major=_SWAPPED_A_MAJOR[self.b_major],
            b_major=_SWAPPED_B_MAJOR[self.a_major],
            out_major=_SWAPPED_OUT_MAJOR[self.out_major],
        )

    @property
    def ab_torch_dtype(self) -> Any:
        return dtypes.torch_dtype(self.ab_dtype)

    @property
    def b_torch_dtype(self) -> Any:
        return dtypes.torch_dtype(self.b_input)

    @property
    def out_torch_dtype(self) -> Any:
        return dtypes.torch_dtype(self.out_dtype)

    @property
    def out_bytes(self) -> int:
        return dtypes.itemsize(self.out_dtype)

    @property
    def key(self) -> str:
        """Stable name, e.g. `bf16_bf16_ak_bn_on_2d` (dtypes, then majors of A, B, out), with
        fp8's types, scaling and promotion: `e4m3xe5m2_bf16_ak_bk_on_2d_row_promoted`, and
        `_unaligned` for an output TMA cannot store to, `_constb` for a constant b, `_bias` for
        a bias."""
        rank = "3d" if self.batched else "2d"
        majors = f"a{self.a_major}_b{self.b_major}_o{self.out_major}"
        inputs = f"{self.ab_dtype}x{self.b_dtype}" if self.b_dtype else self.ab_dtype
        scaling = f"_{self.scaling}" if self.scaling else ""
        promoted = "_promoted" if self.promoted else ""
        unaligned = "" if self.out_aligned else "_unaligned"
        constant = "_constb" if self.constant_b else ""
        bias = "_bias" if self.bias else ""
        variants = f"{scaling}{promoted}{unaligned}{constant}{bias}"
        return f"{inputs}_{self.out_dtype}_{majors}_{rank}{variants}"
