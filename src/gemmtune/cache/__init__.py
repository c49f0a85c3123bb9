"""The two caches: compiled kernels (level 1) and tuning results (level 2)."""
