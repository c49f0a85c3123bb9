"""Level 1: compiled kernels, from (config, signature) to something to launch.

In memory, a dictionary: a kernel is compiled or loaded once per process. On disk, the DSL's
exported kernels linked into shared libraries (`kernels.build.export_gemm`), loaded by TVM-FFI
in about a millisecond instead of a second's compile (and without importing the DSL), under a
folder named by a fingerprint of everything that changes a binary: gemmtune's version and kernel
sources, the DSL's version and CUDA flavour, the target. The file name is
`kernels.build.artifact_name`, the name the compile workers write, so tuning fills this cache
and a miss here is compiled by a compile worker too. Writes go to a temporary file that is
renamed into place under a file lock; a file that cannot be loaded is set aside with a warning
and rebuilt.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from pathlib import Path

from gemmtune.core.config import GemmConfig
from gemmtune.core.settings import cache_dir
from gemmtune.core.versions import DSL_LIBRARY_FLAVOURS, gemmtune_version, package_version
from gemmtune.kernels.build import artifact_name
from gemmtune.kernels.signature import KernelSignature

log = logging.getLogger(__name__)


@functools.cache
def fingerprint(target: str) -> str:
    """A short hash of everything that changes a compiled kernel for `target` (e.g. sm_90a)."""
    digest = hashlib.sha256()
    dists = ["nvidia-cutlass-dsl", *(f"nvidia-cutlass-dsl-libs-{f}" for f in DSL_LIBRARY_FLAVOURS)]
    versions = [f"{d}={package_version(d)}" for d in dists if package_version(d)]
    digest.update(f"gemmtune={gemmtune_version()};{';'.join(versions)};{target}".encode())
    sources = Path(__file__).resolve().parents[1] / "kernels"
    for path in sorted(sources.rglob("*.py")):
        digest.update(path.relative_to(sources).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class KernelCache:
    """Compiled kernels of one target, in memory and in one folder of the cache directory."""

    def __init__(self, target: str = "sm_90a", root: Path | None = None):
        self.target = target
        self.root = Path(root) if root else cache_dir() / "kernels"
        self.folder = self.root / f"{target}-{fingerprint(target)}"
        self.memory: dict[tuple[str, KernelSignature], object] = {}
        self.loads = self.compiles = 0

    def path(self, config: GemmConfig, signature: KernelSignature) -> Path:
        return self.folder / artifact_name(config, signature)

    def get(self, config: GemmConfig, signature: KernelSignature):
        """The kernel for (config, signature): from memory, else from disk, else compiled (and
        written to disk for the next process)."""
        key = (config.compile_key, signature)
        kernel = self.memory.get(key)
        if kernel is None:
            kernel = self._load(config, signature) or self._build(config, signature)
            self.memory[key] = kernel
        return kernel

    def _load(self, config: GemmConfig, signature: KernelSignature):
        from gemmtune.kernels.build import load_gemm

        path = self.path(config, signature)
        if not path.exists():
            return None
        try:
            kernel = load_gemm(path, config, signature)
        except Exception as exc:  # a truncated or foreign file: rebuild it
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            log.warning("kernel file %s cannot be loaded (%s); moved to %s", path, exc, aside)
            path.replace(aside)
            return None
        self.loads += 1
        return kernel

    def _build(self, config: GemmConfig, signature: KernelSignature):
        """Compile in a compile worker (the DSL stays out of this process, and a compiler
        crash costs the worker), then load the file it wrote."""
        from gemmtune import workers
        from gemmtune.kernels.build import load_gemm
        from gemmtune.workers.compiler import CompileJob

        job = CompileJob(config, signature)
        outcome = workers.compile_pool(self.target).submit(job, self.folder).result()
        self.compiles += 1
        return load_gemm(outcome.path, config, signature)
