"""`gemmtune.scaled_mm`'s calls: `torch._scaled_mm` of fp8 operands, by our kernels where they
serve it.

A call's plan is found once per signature (the operands', scales' and bias's shapes, strides
and dtypes, the device and the call's arguments: `scaled_plan_key`). The first call of a
signature runs torch's own, which checks it as the drop-in must (torch's errors are ours) and
answers it; the plan serves the calls after. A call torch checks and cuBLASLt declines (no
algorithm for it: `declined_by_cublas`) is valid, and our kernel answers it from the first
call where one serves it; elsewhere torch's error stands.

Our kernels serve one-element scales (per tensor) or `(m, 1)` and `(1, n)` ones (per row of a
and column of b), in float32, a 16- or 32-bit output, and no bias or a contiguous `(n,)` one of
the output's type, which the kernel adds before rounding. Without fast accumulation the kernel
promotes each k-tile's partial sums into fp32.
"""

from __future__ import annotations

import logging

import torch

from gemmtune.core.dtypes import ALIGNMENT_BYTES
from gemmtune.core.problem import FP8_OUTPUT_DTYPES, GemmProblem, declined_by_cublas

log = logging.getLogger(__name__)


def scaled_plan_key(
    a, b, scale_a, scale_b, out_dtype, use_fast_accum: bool, constant_b: bool = False, bias=None
) -> tuple:
    """What decides a scaled (fp8) call's plan: the operands', scales' and bias's shapes,
    strides and dtypes, the device and the call's arguments."""
    biased = None if bias is None else (bias.shape, bias.stride(), bias.dtype)
    return (
        a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.get_device(),
        scale_a.shape, scale_b.shape, scale_a.dtype, scale_b.dtype, out_dtype, use_fast_accum,
        constant_b, biased,
    )  # fmt: skip


def scaled_call(
    dispatcher,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype | None,
    use_fast_accum: bool,
    constant_b: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype,
    use_fast_accum=use_fast_accum)` through `dispatcher`'s plans (see the module's
    docstring); `Dispatcher.scaled`."""
    device = a.get_device()
    rest = (out_dtype, use_fast_accum, constant_b, bias)
    key = scaled_plan_key(a, b, scale_a, scale_b, *rest)
    plan = dispatcher.plans.get(key)
    options = {"out_dtype": out_dtype, "use_fast_accum": use_fast_accum, "bias": bias}
    if plan is None:
        from gemmtune.api.dispatch import capturing

        try:
            result = torch._scaled_mm(a, b, scale_a, scale_b, **options)
        except RuntimeError as error:
            plan = declined_plan(dispatcher, error, key, a, b, scale_a, scale_b, *rest)
        else:
            if not capturing(a):  # as `new_plan`: no plan is made inside a capture
                dispatcher.plans[key] = dispatcher._scaled_plan(a, b, scale_a, scale_b, *rest)
            return result
    if (
        plan.launcher is None
        or (a.data_ptr() | b.data_ptr()) % ALIGNMENT_BYTES
        or scale_a.get_device() != device
        or scale_b.get_device() != device
        or (bias is not None and bias.get_device() != device)
    ):
        return torch._scaled_mm(a, b, scale_a, scale_b, **options)
    from gemmtune.kernels.launch import kernel_scales

    out = torch.empty_strided(
        plan.out_shape, plan.out_stride, dtype=plan.out_dtype, device=plan.device
    )
    args = plan.args if plan.workspace_stream is None else dispatcher.stream_args(plan, a, b)
    biases = () if bias is None else (bias,)
    plan.launcher(a, b, out, *kernel_scales((scale_a, scale_b)), *biases, *args)
    return out


def declined_plan(dispatcher, error: RuntimeError, key: tuple, a, b, *rest):
    """The plan, kept in `dispatcher.plans`, of a scaled product torch checked and cuBLASLt
    declined (`declined_by_cublas`): our kernel, where one serves it; else torch's `error`
    is the call's, as any other error of torch's is."""
    from gemmtune.api.dispatch import capturing

    if not declined_by_cublas(error) or capturing(a):
        raise error
    plan = dispatcher._scaled_plan(a, b, *rest)
    if plan.launcher is None:
        raise error
    log.info(
        "torch._scaled_mm declines %s x %s (%s); our kernel serves it",
        *(a.shape, b.shape, plan.config.key),
    )
    dispatcher.plans[key] = plan
    return plan


def new_scaled_plan(
    dispatcher,
    a,
    b,
    scale_a,
    scale_b,
    out_dtype,
    use_fast_accum: bool,
    constant_b: bool = False,
    bias: torch.Tensor | None = None,
):
    """The plan of a scaled product: our kernel where one serves it (a bias: one element per
    column, in the output's type, read one element at a time), else torch's with the
    reason; `Dispatcher._scaled_plan`."""
    from gemmtune.api.dispatch import Plan, resolve_mode

    m, n = a.shape[0], b.shape[1]
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        scaling = "tensor"
    elif tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n):
        scaling = "row"
    else:
        return Plan(None, (), None, reason="a scaling our kernels do not apply")
    if out_dtype not in FP8_OUTPUT_DTYPES:
        return Plan(None, (), None, reason=f"output {out_dtype}: kernels write 16/32-bit")
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        return Plan(None, (), None, reason="kernels read float32 scales")
    if bias is not None and (
        tuple(bias.shape) != (n,) or bias.stride() != (1,) or bias.dtype != out_dtype
    ):
        why = "kernels add a contiguous (n,) bias of the output's type"
        return Plan(None, (), None, reason=why)
    resolved = resolve_mode(None)
    problem = GemmProblem.from_tensors(
        a, b, None, out_dtype, scaling=scaling, promoted=not use_fast_accum,
        bias=bias is not None,
    )  # fmt: skip
    if resolved == "off" or not problem.supported:
        return Plan(None, (), None, reason=problem.fallback_reason or "mode off")
    return dispatcher._kernel_plan(problem, resolved, constant_b=constant_b)
