"""The search space: every valid config for a problem, and a model that ranks them."""

from gemmtune.space.candidates import binaries, candidates, runtime_variants

__all__ = ["binaries", "candidates", "runtime_variants"]
