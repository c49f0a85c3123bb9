"""The search space: every valid config for a problem, and a model that ranks them."""

from gemmtune.space.candidates import binaries, candidates, refusal, runtime_variants

__all__ = ["binaries", "candidates", "refusal", "runtime_variants"]
