"""What a benchmark worker runs for `@autotune`: a user's callable, timed at each config.

The same discipline as `runner.GemmRunner`, for any function that takes a config: the
arguments are placed once (on the GPU they came from), the reference output is computed once,
and each config's output is poisoned with NaN, computed, checked against the reference and only
then timed (CUDA events, warm-up, cold L2, median). In a benchmark worker
(`workers.bench.BenchWorker`) the function and the reference are named by import path, and
tensors travel as CPU copies.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gemmtune.measure.runner import GemmRunner, Measurement
from gemmtune.measure.timing import IdleWarmup, L2Flusher, time_cuda
from gemmtune.measure.verify import poison, relative_error, tolerance


def resolve(target: str | Callable) -> Callable:
    """A callable, or one named "module:qualified.name". A name that is bound to an
    `@autotune` wrapper resolves to the function it wraps."""
    if callable(target):
        return target
    module, _, qualname = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return getattr(found, "fn", found)


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` with `fn` applied to every tensor in it (through lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def to_device(value: Any, device: torch.device) -> Any:
    return map_tensors(value, lambda t: t.to(device))


def to_cpu(value: Any) -> Any:
    return map_tensors(value, lambda t: t.detach().cpu())


@dataclass
class CallableSpec:
    """A function and the arguments to time it on. `output` names the argument (position or
    keyword) the function writes its result into, when it returns None."""

    function: str | Callable
    args: tuple
    kwargs: dict
    config_arg: str = "config"
    reference: str | Callable | None = None
    output: int | str | None = None
    device_index: int = 0
    on_device: bool = field(default=False)  # the tensors are already where they run


@dataclass(frozen=True)
class CallableJob:
    """Verify, then time the function at `config`."""

    config: Any
    warmup_ms: float = 10.0
    runs: int = 30
    kind: str = "measure"


class CallableRunner:
    """The worker-side state of one `@autotune` tuning run."""

    def __init__(self, spec: CallableSpec):
        device = torch.device("cuda", spec.device_index)
        torch.cuda.set_device(device)
        self.spec = spec
        self.function = resolve(spec.function)
        place = (lambda v: v) if spec.on_device else (lambda v: to_device(v, device))
        self.args, self.kwargs = place(spec.args), place(spec.kwargs)
        self.reference = None
        if spec.reference is not None:
            expected = resolve(spec.reference)(*self.args, **self.kwargs)
            torch.cuda.synchronize()
            if expected is None and spec.output is not None:
                expected = self._output()
            self.reference = None if expected is None else expected.detach().float().clone()
        self.flush = L2Flusher(device)
        self.idle = IdleWarmup()  # a user's JIT compiling a config leaves the GPU idle

    def _output(self) -> torch.Tensor | None:
        where = self.spec.output
        if where is None:
            return None
        return self.args[where] if isinstance(where, int) else self.kwargs[where]

    def _call(self, config: Any) -> Any:
        return self.function(*self.args, **self.kwargs, **{self.spec.config_arg: config})

    def measure(self, job: CallableJob) -> Measurement:
        name = repr(job.config)
        output = self._output()
        if output is not None and output.is_floating_point():
            poison(output)
        result = self._call(job.config)
        torch.cuda.synchronize()
        err = math.nan
        if self.reference is not None:
            got = result if isinstance(result, torch.Tensor) else output
            if got is None:
                return Measurement(name, None, error="no output to check: return it or name it")
            if got.shape != self.reference.shape:
                return Measurement(name, None, error=f"output shape {tuple(got.shape)} is wrong")
            err = relative_error(got, self.reference)
            if not err <= tolerance(got.dtype):
                return Measurement(
                    name, None, rel_err=err, error=f"wrong result: rel err {err:.3g}"
                )
        timing = time_cuda(
            lambda: self._call(job.config),
            warmup_ms=self.idle.warmup_ms(job.warmup_ms),
            runs=job.runs,
            flush=self.flush,
        )
        self.idle.timed()
        return Measurement(name, timing.median_ms, timing.spread, err)

    poisoned = staticmethod(GemmRunner.poisoned)
