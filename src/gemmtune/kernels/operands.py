"""How both kernels (Hopper's and Blackwell's) see the tensors they are called with.

Tensors arrive in torch's order, (m, k) / (k, n) / (m, n) with an optional leading batch
dimension; a kernel views them as (M, K, L) / (N, K, L) / (M, N, L) at trace time, so a launch
passes torch tensors untouched. Imports the DSL: kernel-side only.
"""

import cutlass
import cutlass.cute as cute
from cutlass.tensor_utils import LayoutEnum

from gemmtune.kernels.signature import KernelSignature

DSL_DTYPES = {
    "bf16": cutlass.BFloat16,
    "fp16": cutlass.Float16,
    "fp32": cutlass.Float32,
    "int8": cutlass.Int8,
    "int32": cutlass.Int32,
    "e4m3": cutlass.Float8E4M3FN,
    "e5m2": cutlass.Float8E5M2,
}


def accumulator_dtype(signature: KernelSignature) -> type:
    """What the MMA accumulates in: int32 for int8 inputs (exact), else fp32."""
    return cutlass.Int32 if signature.ab_dtype == "int8" else cutlass.Float32


def kernel_view(t: cute.Tensor, rows: int, cols: int) -> cute.Tensor:
    """The (rows, cols, L) view of a tensor in torch order; `rows` and `cols` index its last
    two dimensions (0 or 1). A 2-D tensor gets a unit batch mode."""
    layout = t.layout
    batched = cute.rank(layout) == 3
    base = 1 if batched else 0
    shape = (layout.shape[base + rows], layout.shape[base + cols])
    stride = (layout.stride[base + rows], layout.stride[base + cols])
    if batched:
        shape, stride = (*shape, layout.shape[0]), (*stride, layout.stride[0])
    else:
        shape, stride = (*shape, 1), (*stride, 0)
    return cute.make_tensor(t.iterator, cute.make_layout(shape, stride=stride))


def kernel_operands(
    a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, swap_ab: bool
) -> tuple[cute.Tensor, cute.Tensor, cute.Tensor]:
    """The kernel's A (M, K, L), B (N, K, L) and C (M, N, L) views of the torch-ordered a, b and
    c. A `swap_ab` kernel computes out^T = b^T @ a^T: its A is b^T, its B a^T and its C out^T,
    which are b, a and out with their last two modes read the other way round. So a swapped
    launch passes the problem's tensors as they are, and no transposed views are made per call."""
    if swap_ab:
        return kernel_view(b, 1, 0), kernel_view(a, 0, 1), kernel_view(c, 1, 0)
    return kernel_view(a, 0, 1), kernel_view(b, 1, 0), kernel_view(c, 0, 1)


def operand_layouts(signature: KernelSignature) -> tuple[LayoutEnum, LayoutEnum, LayoutEnum]:
    """The DSL's layouts of A (M, K), B (N, K) and C (M, N) as the kernels view them: row-major
    where K (for A and B) or N (for C) is contiguous."""

    def layout(row_major: bool) -> LayoutEnum:
        return LayoutEnum.ROW_MAJOR if row_major else LayoutEnum.COL_MAJOR

    return (
        layout(signature.a_major == "k"),
        layout(signature.b_major == "k"),
        layout(signature.out_major == "n"),
    )
