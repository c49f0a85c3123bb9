"""Environment variables that configure gemmtune, read in one place."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "GEMMTUNE_CACHE_DIR"


def cache_dir() -> Path:
    """Where compiled kernels and tuning results live: `$GEMMTUNE_CACHE_DIR`, else
    `$XDG_CACHE_HOME/gemmtune`, else `~/.cache/gemmtune` (the CuTe DSL runs on Linux only)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemmtune"
