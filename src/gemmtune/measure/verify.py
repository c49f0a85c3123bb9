"""Is a candidate's output right? Compared with a float32 reference, with a tolerance that
depends on the output's dtype (its rounding dominates the error); an integer output (int8
inputs) with its exact reference, element for element.

The one tolerance of gemmtune: the tuner, `@autotune`, the benchmarks and the tests all check
results with it.
"""

from __future__ import annotations

import math

import torch

from gemmtune.core import dtypes

#: relative Frobenius error allowed per output dtype: a few units of its rounding error, and far
#: below what a wrong tile, a missed k-tile or an unwritten element produces
TOLERANCE = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 1e-4, torch.int32: 0.0}


#: relative error allowed for a product of fp8 inputs, whatever its output: the tensor cores
#: keep an fp8 product's fp32 accumulators to fewer bits than fp32 (what torch._scaled_mm's
#: `use_fast_accum=True` accepts), which a float32 output would otherwise be held to
FP8_ACCUMULATION_TOLERANCE = 1e-2

#: What an integer output is poisoned with before a run: no int8 product sums to it
INTEGER_POISON = -(2**31)


def poison(out: torch.Tensor) -> None:
    """Fill `out` with what a kernel must overwrite: NaN, or `INTEGER_POISON` for integers."""
    out.fill_(math.nan if out.is_floating_point() else INTEGER_POISON)


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """||out - reference|| / ||reference|| in float32; infinity when out holds NaN or Inf. An
    integer output is exact or wrong: 0, or infinity where any element differs."""
    if not out.is_floating_point():
        return 0.0 if torch.equal(out, reference.to(out.dtype)) else math.inf
    if not torch.isfinite(out).all():
        return math.inf
    diff = (out.float() - reference).norm()
    scale = reference.norm()
    return (diff / scale).item() if scale > 0 else diff.item()


def tolerance(out_dtype: torch.dtype, input_dtype: torch.dtype | None = None) -> float:
    """The relative error allowed for an output of `out_dtype` (that of bf16, the loosest of
    ours, for a dtype we do not write: a user's `@autotune` function may return any), of a
    product of `input_dtype` inputs (fp8: at least `FP8_ACCUMULATION_TOLERANCE`)."""
    allowed = TOLERANCE.get(out_dtype, TOLERANCE[torch.bfloat16])
    if dtypes.name_of(input_dtype) in dtypes.FP8:
        allowed = max(allowed, FP8_ACCUMULATION_TOLERANCE)
    return allowed


def check(
    out: torch.Tensor, reference: torch.Tensor, input_dtype: torch.dtype | None = None
) -> tuple[bool, float]:
    """(within tolerance, relative error) of a product of `input_dtype` inputs."""
    err = relative_error(out, reference)
    return err <= tolerance(out.dtype, input_dtype), err
