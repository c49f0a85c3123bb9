"""Tuning: `tune()` for our kernels, `@autotune` for users' own kernel wrappers."""
