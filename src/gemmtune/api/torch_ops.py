"""tuned_gemm inside torch: the custom ops `gemmtune::mm`, `gemmtune::int_mm` and
`gemmtune::scaled_mm`, and linear layers that use the first.

`torch.ops.gemmtune.mm(a, b, out_dtype=None, constant_b=False, bias=None)` is
`tuned_gemm(a, b, out_dtype=..., constant_b=..., bias=...)` as an
opaque op: `torch.compile` traces it through its fake implementation (shapes and dtypes only)
and calls the real one at run time, so a compiled model keeps our kernels. Its gradient is two
more `gemmtune::mm` calls (`grad @ b^T`, `a^T @ grad`: transposed views, which our kernels
take as they are), and the bias's: the output's gradient summed to the bias's shape.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.library.custom_op("gemmtune::mm", mutates_args=())
def mm(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    constant_b: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`a @ b` (2-D or batched 3-D), plus `bias` (broadcast to the output), by tuned_gemm;
    tensors off the GPU go to torch.matmul."""
    if not (a.is_cuda and b.is_cuda):
        from gemmtune.core.problem import fallback_matmul

        product = fallback_matmul(a, b, None, out_dtype)
        return product if bias is None else product.add_(bias)
    from gemmtune.api.dispatch import (
        tuned_gemm,  # the op is registered at `import gemmtune`, cheaply
    )

    return tuned_gemm(a, b, out_dtype=out_dtype, constant_b=constant_b, bias=bias)


@mm.register_fake
def _(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    constant_b: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError("gemmtune::mm takes 2-D or 3-D tensors")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    from gemmtune.core.problem import default_out_dtype

    shape = (*batch, a.shape[-2], b.shape[-1])
    if bias is not None:
        from gemmtune.api.bias import BiasFacts, check_bias

        check_bias(BiasFacts.of(bias), shape)
    return a.new_empty(shape, dtype=out_dtype or default_out_dtype(a.dtype))


def _setup_context(ctx, inputs, output) -> None:
    a, b, _, _, bias = inputs
    ctx.save_for_backward(a, b)
    ctx.bias_shape = None if bias is None else bias.shape
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad: torch.Tensor):
    a, b = ctx.saved_tensors
    grad_bias = None
    if ctx.bias_shape is not None and ctx.needs_input_grad[4]:
        grad_bias = grad.sum_to_size(ctx.bias_shape).to(ctx.bias_dtype)
    grad = grad.to(a.dtype)
    grad_a = mm(grad, b.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
    grad_b = None
    if ctx.needs_input_grad[1]:
        grad_b = mm(a.transpose(-1, -2), grad)
        if b.dim() == 2 and grad_b.dim() == 3:  # b was broadcast over the batch
            grad_b = grad_b.sum(0)
    return grad_a, grad_b, None, None, grad_bias


mm.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("gemmtune::int_mm", mutates_args=())
def int_mm(a: torch.Tensor, b: torch.Tensor, constant_b: bool = False) -> torch.Tensor:
    """`torch._int_mm(a, b)` by `gemmtune.int_mm`: int8 (m, k) @ (k, n) -> int32, exact."""
    if not (a.is_cuda and b.is_cuda):
        return torch._int_mm(a, b)
    from gemmtune.api.dispatch import int_mm as tuned_int_mm

    return tuned_int_mm(a, b, constant_b=constant_b)


@int_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, constant_b: bool = False) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.dtype != torch.int8 or b.dtype != torch.int8:
        raise ValueError("gemmtune::int_mm takes two 2-D int8 tensors, as torch._int_mm does")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)


@torch.library.custom_op("gemmtune::scaled_mm", mutates_args=())
def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
    constant_b: bool = False,
) -> torch.Tensor:
    """`torch._scaled_mm` by `gemmtune.scaled_mm`: fp8 (m, k) @ (k, n), scaled, as out_dtype."""
    from gemmtune.api.dispatch import scaled_mm as tuned_scaled_mm

    return tuned_scaled_mm(
        a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
        constant_b=constant_b,
    )  # fmt: skip


@scaled_mm.register_fake
def _(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
    constant_b: bool = False,
) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError("gemmtune::scaled_mm takes two 2-D tensors, as torch._scaled_mm does")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


class TunedLinear(nn.Module):
    """An `nn.Linear` whose product runs through `gemmtune::mm`; it shares the original
    layer's parameters (the state dict is unchanged). `constant_weight`: the weight does not
    change while the model runs (inference), so its loads may start before the kernel ahead
    of the product finishes (`tuned_gemm`'s `constant_b`)."""

    def __init__(self, linear: nn.Linear, constant_weight: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.constant_weight = constant_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = mm(rows, self.weight.t(), None, self.constant_weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tuned"


def use_tuned_linear(model: nn.Module, constant_weights: bool = False) -> int:
    """Swap every `nn.Linear` inside `model` for a `TunedLinear` (in place, parameters shared);
    returns how many were swapped. Products our kernels do not serve (a GPU or dtype they do
    not run on) still go to torch.matmul, inside tuned_gemm. `constant_weights`, for a model
    that only runs inference: no kernel writes a weight right before the layer reads it (an
    optimizer step does), so the layers' weight loads may start early."""
    swapped = 0
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, TunedLinear(child, constant_weights))
            swapped += 1
        else:
            swapped += use_tuned_linear(child, constant_weights)
    return swapped
