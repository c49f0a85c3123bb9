"""`tuned_gemm(a, b, bias=...)`: `a @ b + bias`, the bias added in our kernel's epilogue where
it can be.

    fused       a contiguous (n,) bias of the output's type on the operands' GPU, a problem the
                Hopper kernel serves with one: the kernel adds it in fp32 to the finished sums,
                before the output is rounded (`kernels.bias`); a tune times it so, against
                torch.addmm
    torch       the product is torch's (its tuning won, or our kernels do not serve it), a 2-D
                call without `out`/`out_dtype` whose bias has the inputs' type:
                `torch.addmm(bias, a, b)`, which adds the bias in cuBLAS's epilogue
    added       every other bias that broadcasts to the output (an (m, n) or (1, n) matrix,
                another type, a GPU whose kernel adds none): tuned_gemm's product, then
                `add_(bias)` on it

A biased call has its own plan, found once per signature as tuned_gemm's are; its key holds
the bias's shape, strides, type and device, so the hot path is the same dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from gemmtune.core.dtypes import ALIGNMENT_BYTES
from gemmtune.core.problem import GemmProblem
from gemmtune.core.settings import MODE_ENV

#: what sets biased plans' keys apart from unbiased ones of the same tensors
BIASED = "bias"
#: input types torch.addmm multiplies with a bias of their own type
ADDMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


class BiasFacts(NamedTuple):
    """What decides how a bias is added: its shape, strides, type and device."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, bias: torch.Tensor) -> BiasFacts:
        return cls(tuple(bias.shape), bias.stride(), bias.dtype, bias.device)


def check_bias(bias: BiasFacts, out_shape: tuple[int, ...]) -> None:
    """Raise for a bias that does not broadcast to the output (as torch.addmm raises)."""
    try:
        broadcast = torch.broadcast_shapes(bias.shape, out_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != tuple(out_shape):
        raise ValueError(
            f"bias of shape {bias.shape} does not broadcast to the output's {tuple(out_shape)}"
        )


def fuses(bias: BiasFacts, problem: GemmProblem) -> bool:
    """Whether our kernels may add `bias` to `problem`'s product themselves: one element per
    column in the output's type, contiguous, on the operands' GPU (int8 products take none)."""
    return (
        bias.shape == (problem.n,)
        and (bias.stride == (1,) or problem.n == 1)
        and bias.dtype == problem.out_dtype
        and bias.device == problem.device
        and problem.a_dtype != torch.int8
    )


def torch_adds(bias: BiasFacts, a: torch.Tensor, b: torch.Tensor, out, out_dtype) -> bool:
    """Whether torch.addmm(bias, a, b) computes the call exactly as asked: 2-D operands and a
    bias of their (floating) type, no `out` and no `out_dtype`."""
    return (
        a.dim() == b.dim() == 2
        and out is None
        and out_dtype is None
        and a.dtype == b.dtype == bias.dtype
        and a.dtype in ADDMM_DTYPES
    )


def addmm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The torch route of a biased plan: `torch.addmm(bias, a, b)`."""
    return torch.addmm(bias, a, b)


def bias_plan_key(
    a, b, bias, out, out_dtype, mode: str | None, signature: Callable | None, constant_b: bool
) -> tuple:
    """What decides a biased call's plan: `dispatch.plan_key`'s facts with the bias's.
    `biased_function` builds the same key inline."""
    from gemmtune.api.dispatch import python_signature

    key = None
    if signature is not None:
        key = signature(a, b, bias) if out is None else signature(a, b, out, bias)
    if key is None:
        key = (python_signature(a, b, out), *python_facts(bias))
    return (BIASED, key, out_dtype, mode, constant_b)


def python_facts(bias) -> tuple:
    """The bias's part of a plan key, read from Python; a bias that is not a tensor raises."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a tensor (as torch.addmm's), got {type(bias).__name__}")
    return (bias.shape, bias.stride(), bias.dtype, bias.get_device())


def biased_function(dispatcher) -> Callable[..., torch.Tensor]:
    """The hot path of `tuned_gemm`'s biased calls over `dispatcher`'s plans:
    `biased(a, b, bias, out, out_dtype, mode, constant_b)`."""
    from gemmtune.api.dispatch import python_signature, with_autograd

    plans = dispatcher.plans
    signature = dispatcher.signature
    empty_strided = torch.empty_strided
    is_grad_enabled = torch.is_grad_enabled

    def added(a, b, bias, out, out_dtype, mode, constant_b) -> torch.Tensor:
        product = dispatcher.gemm(a, b, out=out, out_dtype=out_dtype, mode=mode,
                                  constant_b=constant_b)  # fmt: skip
        return product.add_(bias)

    def biased(a, b, bias, out, out_dtype, mode, constant_b) -> torch.Tensor:
        key = None
        if signature is not None:
            key = signature(a, b, bias) if out is None else signature(a, b, out, bias)
        if key is None:
            key = (python_signature(a, b, out), *python_facts(bias))
        key = (BIASED, key, out_dtype, mode, constant_b)
        plan = plans.get(key) or new_bias_plan(
            dispatcher, key, a, b, bias, out, out_dtype, mode, constant_b
        )  # fmt: skip
        launcher = plan.launcher
        if launcher is None:
            if plan.torch_op is not None:
                return plan.torch_op(a, b, bias)
            return added(a, b, bias, out, out_dtype, mode, constant_b)
        if (a.requires_grad or b.requires_grad or bias.requires_grad) and is_grad_enabled():
            return with_autograd(a, b, out, out_dtype, constant_b, bias)
        if (a.data_ptr() | b.data_ptr()) % ALIGNMENT_BYTES:
            return added(a, b, bias, out, out_dtype, mode, constant_b)
        if out is None:
            out = empty_strided(
                plan.out_shape, plan.out_stride, dtype=plan.out_dtype, device=plan.device
            )
        elif out.data_ptr() % plan.out_alignment:
            return added(a, b, bias, out, out_dtype, mode, constant_b)
        args = plan.args if plan.workspace_stream is None else dispatcher.stream_args(plan, a, b)
        at = plan.bias_at
        launcher(a, b, out, *args[:at], bias, *args[at:])
        return out

    return biased


def new_bias_plan(
    dispatcher, key: object, a, b, bias, out, out_dtype, mode: str | None, constant_b: bool
):
    """Make, keep (outside a CUDA graph capture) and return the plan of a biased call whose key
    `dispatcher.plans` lacks; raise for a call that is wrong."""
    from gemmtune.api.dispatch import Plan, capturing, resolve_mode, unit_scales

    facts = BiasFacts.of(bias)
    problem = GemmProblem.from_tensors(a, b, out, out_dtype)  # raises for a wrong call
    check_bias(facts, problem.out_shape)
    if capturing(a):  # the product's plan is made after the capture, as tuned_gemm's
        return Plan(None, (), None, reason="first met inside a CUDA graph capture", torch_op=None)
    resolved = resolve_mode(mode)
    if resolved == "off" or not problem.supported:
        reason = problem.fallback_reason or f'mode "off" ({MODE_ENV} or mode=)'
        torch_serves = True
    elif not fuses(facts, problem):
        reason = (
            f"a bias of shape {facts.shape} and type {facts.dtype} is added after the product "
            "(kernels add a contiguous (n,) bias of the output's type)"
        )
        torch_serves = False
    else:
        fused = GemmProblem.from_tensors(a, b, out, out_dtype, bias=True)  # fp8: unit scales
        if fused.supported:
            scales = unit_scales(a.device) if fused.scaling else ()
            plan = dispatcher._kernel_plan(fused, resolved, scales, constant_b)
            plan.bias_at = len(scales)
            reason = plan.reason  # None where our kernel serves; else torch won the tuning
        else:
            reason = fused.fallback_reason
        torch_serves = fused.supported
    if reason is not None:
        # torch.addmm where torch serves the product, else our product with the bias added
        adds = torch_serves and torch_adds(facts, a, b, out, out_dtype)
        plan = Plan(None, (), None, reason=reason, torch_op=addmm if adds else None)
    dispatcher.plans[key] = plan
    return plan
