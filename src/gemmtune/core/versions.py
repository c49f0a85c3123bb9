"""The versions of gemmtune and of the software its results depend on, read in one place.

Cache keys (a tuned result, a compiled kernel's folder), `gemmtune doctor` and benchmark
result files all name versions; they all read them here.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata

#: the CuTe DSL's libraries come in one distribution per CUDA major version
DSL_LIBRARY_FLAVOURS = ("cu12", "cu13")


@functools.cache
def package_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or None where it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def gemmtune_version() -> str:
    from gemmtune import __version__

    return __version__


def dsl_version() -> str | None:
    return package_version("nvidia-cutlass-dsl")


def dsl_flavours() -> list[str]:
    """The CUDA flavours of the DSL's installed libraries ("cu13", ...)."""
    return [f for f in DSL_LIBRARY_FLAVOURS if package_version(f"nvidia-cutlass-dsl-libs-{f}")]


def software() -> dict[str, str | None]:
    """gemmtune, the DSL, torch and the CUDA torch was built for: what a results file names."""
    import torch

    return {
        "gemmtune": gemmtune_version(),
        "cutlass_dsl": dsl_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
