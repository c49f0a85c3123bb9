"""Is a candidate's output right? Compared with a float32 reference, with a tolerance that
depends on the output's dtype (its rounding dominates the error).

The one tolerance of gemmtune: the tuner, `@autotune`, the benchmarks and the tests all check
results with it.
"""

from __future__ import annotations

import math

import torch

#: relative Frobenius error allowed per output dtype: a few units of its rounding error, and far
#: below what a wrong tile, a missed k-tile or an unwritten element produces
TOLERANCE = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 1e-4}


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """||out - reference|| / ||reference|| in float32; infinity when out holds NaN or Inf."""
    if not torch.isfinite(out).all():
        return math.inf
    diff = (out.float() - reference).norm()
    scale = reference.norm()
    return (diff / scale).item() if scale > 0 else diff.item()


def tolerance(out_dtype: torch.dtype) -> float:
    """The relative error allowed for an output of `out_dtype` (that of bf16, the loosest of
    ours, for a dtype we do not write: a user's `@autotune` function may return any)."""
    return TOLERANCE.get(out_dtype, TOLERANCE[torch.bfloat16])


def check(out: torch.Tensor, reference: torch.Tensor) -> tuple[bool, float]:
    """(within tolerance, relative error)."""
    err = relative_error(out, reference)
    return err <= tolerance(out.dtype), err
