"""Environment variables that configure gemmtune, read in one place."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_DIR_ENV = "GEMMTUNE_CACHE_DIR"


def cache_dir() -> Path:
    """Where compiled kernels and tuning results live: `$GEMMTUNE_CACHE_DIR`, else the user's
    cache directory (`~/.cache/gemmtune` on Linux)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("gemmtune", appauthor=False))
