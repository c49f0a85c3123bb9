"""Environment variables that configure gemmtune, read in one place."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "GEMMTUNE_CACHE_DIR"
MODE_ENV = "GEMMTUNE_MODE"
#: what tuned_gemm does on a cache miss: tune, take the ranking model's first choice without
#: tuning (cache-only: from the cache where it holds the bucket; heuristic: always), or
#: hand every call to torch.matmul
MODES = ("tune", "cache-only", "heuristic", "off")


def cache_dir() -> Path:
    """Where compiled kernels and tuning results live: `$GEMMTUNE_CACHE_DIR`, else
    `$XDG_CACHE_HOME/gemmtune`, else `~/.cache/gemmtune` (the CuTe DSL runs on Linux only)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemmtune"
