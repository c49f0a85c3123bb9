"""`tuned_gemm`: a @ b by the best kernel for the problem on this GPU, and its modes.

    tuned_gemm(a, b)
      plan cache (this process)     tensor facts -> kernel + launch arguments: a hit is a dict
                                    lookup, an alignment check and a launch
      on a miss: GemmProblem        validate; unsupported -> torch.matmul (reason logged once)
                 ConfigChooser      the bucket's record, a tune, or the model's first choice
                 KernelCache        config -> compiled kernel (level 1: dict, disk, compile)

The hot path is the plan lookup: its key is what `a`, `b` and `out` say about themselves
(ranks, shapes, strides, dtypes, devices: one C call, `_signature.c`, or Python's attribute
reads where the extension is not built) and the call's arguments, so a hit does one dictionary
lookup before the launch. Everything else (validation, the mode from the
environment, the choice, the kernel, its workspace) is settled when the plan is made, once per
tensor signature and mode.

Modes (`mode=` or `GEMMTUNE_MODE`, read when a plan is made): "tune" (default: tune on a miss,
then cache), "cache-only" (never tune: on a miss the ranking model's first choice, for
production), "heuristic" (always the ranking model's first choice), "off" (torch.matmul).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import tvm_ffi  # our kernels' launch runtime: loaded with gemmtune, not at a first call

from gemmtune.api.choice import ConfigChooser
from gemmtune.api.scaled import new_scaled_plan, scaled_call, scaled_plan_key
from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.core.dtypes import ALIGNMENT_BYTES
from gemmtune.core.problem import (
    FP8_DTYPES,
    FallbackReason,
    GemmProblem,
    fallback_matmul,
    integer_matmul,
)
from gemmtune.core.settings import MODE_ENV, MODES

log = logging.getLogger(__name__)


def resolve_mode(mode: str | None) -> str:
    mode = mode or os.environ.get(MODE_ENV, "tune")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)} (mode= or {MODE_ENV})")
    return mode


@dataclass(slots=True)
class Plan:
    """How every call with one tensor signature runs, found once."""

    launcher: Callable | None  # the compiled kernel's; None: torch serves
    args: tuple  # what follows (a, b, out): workspace, runtime arguments
    config: GemmConfig | None  # None: torch serves
    out_shape: tuple = ()
    out_stride: tuple = ()  # contiguous: how `out` is allocated where the call gives none
    out_dtype: torch.dtype | None = None
    device: torch.device | None = None
    workspace_stream: int | None = None  # the stream whose workspace `args` holds, if any
    reason: FallbackReason | str | None = None  # why torch serves
    #: what serves a call without out/out_dtype where torch does; a biased call's plan
    #: (`api.bias`): torch.addmm's route, or None where the bias is added to tuned_gemm's product
    torch_op: Callable | None = torch.matmul
    #: what the kernel assumes of `out`'s address: 16 bytes, or one element where the plan's
    #: kernel stores directly to an output TMA cannot (`GemmProblem.out_aligned`)
    out_alignment: int = ALIGNMENT_BYTES
    #: a biased call's kernel: where the bias goes among `args` (after the bound scales)
    bias_at: int = 0


def python_signature(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> tuple:
    """What the tensors of a call say about themselves that decides its plan: each one's
    shape, strides, dtype and device, read from Python. `tensor_signature` (C) reads the same
    facts in one call; this serves where it is not built or cannot read a tensor."""
    if out is None:
        return (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype,
                b.get_device())  # fmt: skip
    return (
        a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype,
        b.get_device(), out.shape, out.stride(), out.dtype, out.get_device(),
    )  # fmt: skip


def native_signature() -> Callable[..., bytes | None] | None:
    """`_signature.tensor_signature` bound to torch's DLPack exchange API, or None where the
    extension was not built (no C compiler at install) or this torch publishes no such API."""
    try:
        from gemmtune.api import _signature
    except ImportError:
        return None
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if api is None or not _signature.bind(api):
        return None
    return _signature.tensor_signature


NATIVE_SIGNATURE = native_signature()


def plan_key(
    a: torch.Tensor,
    b: torch.Tensor,
    out,
    out_dtype,
    mode: str | None,
    signature: Callable | None = NATIVE_SIGNATURE,
    constant_b: bool = False,
) -> object:
    """What decides a call's plan: the tensors' signature (rank, shapes, strides, dtypes and
    devices: one bytes object where the C `signature` reads them, else a tuple), with the
    call's `out_dtype`, `mode` and `constant_b` where any is given. `dispatch_function` builds
    the same key inline."""
    tensors = (a, b) if out is None else (a, b, out)
    key = signature(*tensors) if signature is not None else None
    if key is None:
        key = python_signature(*tensors)
    if out_dtype is None and mode is None and not constant_b:
        return key
    return (key, out_dtype, mode, constant_b)


def torch_op(a: torch.Tensor, b: torch.Tensor) -> Callable:
    """The narrowest torch function that computes `a @ b` for these ranks: torch.mm and
    torch.bmm skip torch.matmul's broadcasting logic, a measurable part of a small call. int8
    goes to `integer_matmul` (torch._int_mm where it can), fp8 to float32 (`fallback_matmul`)."""
    if a.dtype == torch.int8:
        return integer_matmul
    if a.dtype in FP8_DTYPES:
        return fallback_matmul
    if a.dim() == b.dim() == 2:
        return torch.mm
    if a.dim() == b.dim() == 3 and a.shape[0] == b.shape[0]:
        return torch.bmm
    return torch.matmul


def dispatch_function(dispatcher: Dispatcher) -> Callable[..., torch.Tensor]:
    """`dispatcher`'s hot path, as `tuned_gemm(a, b, *, out, out_dtype, mode)`.

    `plan_key` inlined, one dictionary lookup, the launch. A cached call must cost the host no
    more than `torch.mm`'s own call plus about a microsecond: the key is one C call where the
    extension is built (every tensor attribute read from Python costs tens of nanoseconds),
    nothing is read twice, no helper is called, and the plans are a closure's variable rather
    than an attribute."""
    plans = dispatcher.plans
    new_plan = dispatcher.new_plan
    stream_args = dispatcher.stream_args
    signature = dispatcher.signature or python_signature
    # the cheapest way torch offers from Python to allocate a tensor of a given shape, dtype
    # and device: no TensorOptions merged with a's, as `a.new_empty` does
    empty_strided = torch.empty_strided
    is_grad_enabled = torch.is_grad_enabled
    from gemmtune.api.bias import biased_function

    biased = biased_function(dispatcher)

    def tuned_gemm(
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        mode: str | None = None,
        constant_b: bool = False,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`a @ b` (2-D, or batched 3-D), plus `bias` where given, by the best kernel for the
        problem on this GPU.

        On the first call for a problem's bucket it tunes (mode "tune"), then caches;
        afterwards it dispatches. What our kernels do not serve goes to torch.matmul; wrong
        calls raise. `constant_b`: no kernel launched right before this call on the stream
        writes `b` (a weight during inference); our Hopper kernels then start loading `b`
        while that kernel finishes. `bias` broadcasts to the output (as torch.addmm's); a
        contiguous (n,) vector of the output's type is added in our kernel's epilogue, before
        rounding (`api.bias`).
        """
        if bias is not None:
            return biased(a, b, bias, out, out_dtype, mode, constant_b)
        key = signature(a, b) if out is None else signature(a, b, out)
        if key is None:
            key = python_signature(a, b, out)
        if out_dtype is not None or mode is not None or constant_b:
            key = (key, out_dtype, mode, constant_b)
        plan = plans.get(key) or new_plan(key, a, b, out, out_dtype, mode, constant_b)
        launcher = plan.launcher
        if launcher is None:
            if out is None and out_dtype is None:
                return plan.torch_op(a, b)
            return fallback_matmul(a, b, out, out_dtype)
        # our kernels record no gradient: a call that wants one goes through the op that does
        if (a.requires_grad or b.requires_grad) and is_grad_enabled():
            return with_autograd(a, b, out, out_dtype, constant_b)
        # The plan was made for these strides, dtypes and devices; a call whose pointers break
        # the alignment it assumes goes where torch decides.
        if (a.data_ptr() | b.data_ptr()) % ALIGNMENT_BYTES:
            return fallback_matmul(a, b, out, out_dtype)
        if out is None:
            out = empty_strided(
                plan.out_shape, plan.out_stride, dtype=plan.out_dtype, device=plan.device
            )
        elif out.data_ptr() % plan.out_alignment:
            return fallback_matmul(a, b, out, out_dtype)
        args = plan.args if plan.workspace_stream is None else stream_args(plan, a, b)
        launcher(a, b, out, *args)
        return out

    return tuned_gemm


def with_autograd(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    constant_b: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`a @ b` (+ `bias`) where autograd must record it and our kernel would serve: through
    `torch.ops.gemmtune.mm`, whose forward is the same kernel (run with grad mode off) and whose
    backward is two more of them (and the bias's gradient, the output's summed over rows).
    With `out=`, `fallback_matmul`: torch computes the product and copies it into `out`, whose
    gradient flows through the copy."""
    if out is not None:
        result = fallback_matmul(a, b, out, out_dtype)
        return result if bias is None else result.add_(bias)
    from gemmtune.api.torch_ops import mm

    return mm(a, b, out_dtype, constant_b, bias)


def capturing(a: torch.Tensor) -> bool:
    """Whether a call on `a` is being captured into a CUDA graph (on its device's current
    stream)."""
    from gemmtune.kernels.launch import capturing as stream_capturing

    return stream_capturing(a.device)


UNIT_SCALES: dict[torch.device, tuple] = {}


def unit_scales(device: torch.device) -> tuple:
    """Scales of one for both operands, as a kernel takes them (TVM-FFI tensors): how
    tuned_gemm runs an fp8 product, which has no scales."""
    if device not in UNIT_SCALES:
        one = tvm_ffi.from_dlpack(torch.ones(1, dtype=torch.float32, device=device))
        UNIT_SCALES[device] = (one, one)
    return UNIT_SCALES[device]


class Dispatcher:
    """The state behind `tuned_gemm`: plans, kernels, and the chooser of configs."""

    def __init__(
        self,
        chooser: ConfigChooser | None = None,
        signature: Callable[..., bytes | None] | None = NATIVE_SIGNATURE,
    ):
        self.chooser = chooser or ConfigChooser()
        #: the plan key's tensor signature in C; None: read from Python (`python_signature`)
        self.signature = signature
        self.plans: dict[object, Plan] = {}  # plan_key -> Plan
        self.kernel_caches: dict[str, object] = {}
        self.fallbacks_logged: set[object] = set()  # reason codes, shapes met in captures
        #: `tuned_gemm` over this dispatcher's plans
        self.gemm = dispatch_function(self)

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        mode: str | None = None,
        constant_b: bool = False,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.gemm(
            a, b, out=out, out_dtype=out_dtype, mode=mode, constant_b=constant_b, bias=bias
        )  # fmt: skip

    def plan(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        mode: str | None = None,
        constant_b: bool = False,
        bias: torch.Tensor | None = None,
    ) -> Plan:
        """How `a @ b` (+ `bias`) is computed (found once per tensor signature, tuning if the
        mode says so): a `Plan` whose `config` is None where torch serves or the bias is added
        after the product, with the reason."""
        if bias is not None:
            from gemmtune.api.bias import bias_plan_key, new_bias_plan

            key = bias_plan_key(a, b, bias, out, out_dtype, mode, self.signature, constant_b)
            return self.plans.get(key) or new_bias_plan(
                self, key, a, b, bias, out, out_dtype, mode, constant_b
            )  # fmt: skip
        key = plan_key(a, b, out, out_dtype, mode, self.signature, constant_b)
        return self.plans.get(key) or self.new_plan(key, a, b, out, out_dtype, mode, constant_b)

    def new_plan(
        self, key: object, a, b, out, out_dtype, mode: str | None, constant_b: bool = False
    ) -> Plan:
        """Make, keep and return the plan of a call whose key `plans` lacks. During a CUDA
        graph capture none is made: tuning, loading a kernel and allocating its workspace
        cannot be captured, so torch serves the call (captured as torch's kernel) and the
        first call outside a capture makes the plan (`capture_fallback`)."""
        if capturing(a):
            return self.capture_fallback(a, b)
        resolved = resolve_mode(mode)
        if resolved == "off":
            plan = Plan(None, (), None, reason=f'mode "off" ({MODE_ENV} or mode=)')
        else:
            problem = GemmProblem.from_tensors(a, b, out, out_dtype)
            if problem.supported:
                scales = unit_scales(a.device) if problem.scaling else ()
                plan = self._kernel_plan(problem, resolved, scales, constant_b)
            else:
                plan = Plan(None, (), None, reason=problem.fallback_reason)
                reason = problem.fallback_reason
                if reason.code not in self.fallbacks_logged:
                    self.fallbacks_logged.add(reason.code)
                    log.info("gemmtune falls back to torch.matmul: %s", reason)
        plan.torch_op = torch_op(a, b)
        self.plans[key] = plan
        return plan

    def capture_fallback(self, a: torch.Tensor, b: torch.Tensor) -> Plan:
        """The plan, not kept, of a call met first inside a CUDA graph capture: torch serves it
        (logged once per shape, with the remedy)."""
        shape = (tuple(a.shape), tuple(b.shape), a.dtype)
        if ("capture", shape) not in self.fallbacks_logged:
            self.fallbacks_logged.add(("capture", shape))
            log.warning(
                "gemmtune met %s @ %s (%s) first inside a CUDA graph capture: torch serves it in "
                "this graph; run the shape once before capturing (or pretune it) for our kernels",
                *shape,
            )  # fmt: skip
        plan = Plan(None, (), None, reason="first met inside a CUDA graph capture")
        plan.torch_op = torch_op(a, b)
        return plan

    def _kernel_plan(
        self, problem: GemmProblem, mode: str, scales: tuple = (), constant_b: bool = False
    ) -> Plan:
        """The plan of a problem our kernels serve; a scaled (fp8) kernel's `scales` (TVM-FFI
        tensors) are bound into its arguments, for tuned_gemm's unit scales. A `constant_b`
        call gets the binary that loads b early, unless b is copied before each launch (the
        copy is then the kernel before ours, and writes what ours reads)."""
        from gemmtune.kernels.launch import launch_args
        from gemmtune.kernels.signature import KernelSignature

        config = self.chooser.config_for(problem, mode)
        if config is None:
            reason = "torch.matmul won this bucket's tuning"
            if not problem.arch.verified_on_hardware:
                reason = (
                    f"the {problem.arch.value} kernel has not run on such a GPU before: it serves "
                    "only buckets a tune (mode tune) verified, and this one has no such record"
                )
            return Plan(None, (), None, reason=reason)
        from gemmtune.kernels.transpose import copying_launcher

        signature = KernelSignature.of(problem)
        if constant_b and "b" not in problem.copied:
            signature = dataclasses.replace(signature, constant_b=True)
        kernel = self._kernels(problem).get(config, signature)
        launcher = kernel.launcher
        if problem.copied:
            launcher = copying_launcher(launcher, problem.copied)
        p = problem
        args = launch_args(
            config, p.device, p.m, p.n, p.k, p.l, ab_bytes=p.a_dtype.itemsize
        )  # fmt: skip
        stream = None
        if config.decomposition is not Decomposition.DATA_PARALLEL:
            stream = torch.cuda.current_stream(p.device).stream_id
        return Plan(
            launcher,
            (*scales, *args),
            config,
            p.out_shape,
            p.out_stride,
            p.out_dtype,
            p.device,
            stream,
            out_alignment=ALIGNMENT_BYTES if p.out_aligned else p.out_dtype.itemsize,
        )

    def _kernels(self, problem: GemmProblem):
        from gemmtune.cache.kernels import KernelCache

        target = problem.arch.compile_target
        if target not in self.kernel_caches:
            self.kernel_caches[target] = KernelCache(target)
        return self.kernel_caches[target]

    @staticmethod
    def stream_args(plan: Plan, a: torch.Tensor, b: torch.Tensor) -> tuple:
        """The plan's launch arguments, with the workspace of the current stream: kernels on
        two streams must not share one."""
        if torch.cuda.current_stream(a.device).stream_id == plan.workspace_stream:
            return plan.args
        from gemmtune.kernels.launch import launch_args

        batch = a.shape[0] if a.dim() == 3 else 1
        args = launch_args(
            plan.config, a.device, a.shape[-2], b.shape[-1], a.shape[-1], batch,
            ab_bytes=a.element_size(),
        )  # fmt: skip
        return (*plan.args[: len(plan.args) - len(args)], *args)  # a plan's bound scales first

    #: `torch._scaled_mm(a, b, scale_a, scale_b, bias=..., out_dtype=...,
    #: use_fast_accum=...)` by our kernels where they serve it (`api.scaled`)
    scaled = scaled_call
    #: the plan of a scaled product, our kernel's where one serves it
    _scaled_plan = new_scaled_plan

    def scaled_plan(
        self,
        a,
        b,
        scale_a,
        scale_b,
        out_dtype,
        use_fast_accum: bool = True,
        constant_b: bool = False,
        bias: torch.Tensor | None = None,
    ) -> Plan | None:
        """The plan `scaled` made for calls like this one, None before the first call."""
        return self.plans.get(
            scaled_plan_key(a, b, scale_a, scale_b, out_dtype, use_fast_accum, constant_b, bias)
        )  # fmt: skip

    def tune(self, problem: GemmProblem, **options) -> object:
        """Tune `problem` now (whatever the cache holds), store the result for its bucket and
        return the `TuneResult`; `options` go to `tuner.tune` (top_k, exhaustive, ...)."""
        result = self.chooser.tune(problem, **options)
        self.plans.clear()  # plans made before may have used what this result replaces
        return result


DISPATCHER = Dispatcher()
tuned_gemm = DISPATCHER.gemm


def int_mm(a: torch.Tensor, b: torch.Tensor, *, constant_b: bool = False) -> torch.Tensor:
    """`torch._int_mm(a, b)`: the exact int32 product of an (m, k) and a (k, n) int8 matrix, by
    our kernels where they serve it (a row-major, b column-major: `x @ w.t()` of a row-major
    weight), else by torch. A call torch._int_mm refuses (not 2-D int8 CUDA matrices, m of 16
    or less, k or n not a multiple of 8, mismatched k) goes to it, to fail as it fails.
    `constant_b` is `tuned_gemm`'s (torch has none)."""
    if not (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype == torch.int8
        and a.dim() == b.dim() == 2
        and a.is_cuda
        and b.is_cuda
        and a.shape[0] > 16
        and a.shape[1] == b.shape[0]
        and a.shape[1] % 8 == 0
        and b.shape[1] % 8 == 0
    ):
        return torch._int_mm(a, b)
    return tuned_gemm(a, b, constant_b=constant_b)


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
    *,
    constant_b: bool = False,
) -> torch.Tensor:
    """`torch._scaled_mm`: `(a @ b) * scale_a * scale_b` of an fp8 (m, k) and (k, n) matrix (a
    row-major, b column-major), scaled per tensor (one-element scales) or per row of a and
    column of b ((m, 1) and (1, n) scales), plus `bias`, written as `out_dtype`. Our kernels
    serve calls with a 16- or 32-bit output, without `scale_result`, with or without a bias
    (a contiguous (n,) vector of the output's type, added in fp32 before the output is
    rounded): with `use_fast_accum=True` they sum on the tensor cores, whose fp32 accumulators
    keep fewer bits; without, they add each 128-element k-tile's partial sums into full fp32
    registers (as cuBLAS does). torch serves every other call, and checks each call as it
    checks its own. `constant_b` is tuned_gemm's (not torch's): no kernel launched right
    before the call writes `b`."""
    if (
        scale_result is not None
        or not all(isinstance(t, torch.Tensor) for t in (a, b, scale_a, scale_b))
        or not (bias is None or isinstance(bias, torch.Tensor))
        or a.dtype not in FP8_DTYPES
        or not a.is_cuda
    ):
        return torch._scaled_mm(
            a,
            b,
            scale_a,
            scale_b,
            bias=bias,
            scale_result=scale_result,
            out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )
    return DISPATCHER.scaled(
        a, b, scale_a, scale_b, out_dtype, use_fast_accum, constant_b, bias
    )  # fmt: skip


def plan(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    mode: str | None = None,
    constant_b: bool = False,
    bias: torch.Tensor | None = None,
) -> Plan:
    """How `tuned_gemm` computes `a @ b` with these arguments: the `Plan` a call makes (tuning
    first in mode "tune" where the cache lacks the bucket), whose `config` is the kernel that
    runs, or None with the `reason` torch serves (with a `bias`: or adds it after our
    product)."""
    return DISPATCHER.plan(a, b, out, out_dtype, mode, constant_b, bias)
