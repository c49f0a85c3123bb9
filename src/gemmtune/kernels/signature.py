"""`KernelSignature`: what a compiled kernel is specialised for besides its `GemmConfig`.

One binary serves every M, N, K and L; it is specific to the dtypes, to which mode of each
operand is contiguous, and to whether the tensors carry a batch dimension (rank 2 or 3).
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
    """Dtypes (by short name), majors and rank of the tensors a kernel is compiled for."""

    ab_dtype: str = "bf16"  # A and B share it
    out_dtype: str = "bf16"
    a_major: str = "k"  # "k" | "m"
    b_major: str = "n"  # "k" | "n"
    out_major: str = "n"  # "n" | "m"
    batched: bool = False

    def __post_init__(self) -> None:
        if self.ab_dtype not in dtypes.KERNEL_INPUTS:
            inputs = ", ".join(dtypes.KERNEL_INPUTS)
            raise ValueError(f"ab_dtype={self.ab_dtype!r}: kernels take {inputs} inputs")
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
    def ab_bytes(self) -> int:
        return dtypes.itemsize(self.ab_dtype)

    @classmethod
    def of(cls, problem: GemmProblem) -> KernelSignature:
        """The signature a supported problem needs."""
        return cls(
            ab_dtype=dtypes.name_of(problem.a_dtype),
            out_dtype=dtypes.name_of(problem.out_dtype),
            a_major=problem.a_major or "k",
            b_major=problem.b_major or "n",
            out_major=problem.out_major or "n",
            batched=problem.batched,
        )

    def swapped(self) -> KernelSignature:
        """The signature of the transposed product out^T = b^T @ a^T, the one a `swap_ab`
        config's binary is compiled for."""
        return dataclasses.replace(
            self,
            a_major=_SWAPPED_A_MAJOR[self.b_major],
            b_major=_SWAPPED_B_MAJOR[self.a_major],
            out_major=_SWAPPED_OUT_MAJOR[self.out_major],
        )

    @property
    def ab_torch_dtype(self) -> Any:
        return dtypes.torch_dtype(self.ab_dtype)

    @property
    def out_torch_dtype(self) -> Any:
        return dtypes.torch_dtype(self.out_dtype)

    @property
    def out_bytes(self) -> int:
        return dtypes.itemsize(self.out_dtype)

    @property
    def key(self) -> str:
        """Stable name, e.g. `bf16_bf16_ak_bn_on_2d` (dtypes, then majors of A, B, out)."""
        rank = "3d" if self.batched else "2d"
        majors = f"a{self.a_major}_b{self.b_major}_o{self.out_major}"
        return f"{self.ab_dtype}_{self.out_dtype}_{majors}_{rank}"
