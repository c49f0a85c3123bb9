"""Compile many kernels at once, in worker processes.

Each worker is a spawned (not forked) Python process with `CUTE_DSL_ARCH` set before it
imports `cutlass`; it compiles a kernel and exports it as an object file, under the name and
with the atomic write of the kernel cache (`cache/kernels.py`), which the caller loads in about
a millisecond. A compile that crashes or hangs costs its worker, never the caller.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from gemmtune.cache.kernels import kernel_file_name
from gemmtune.config import GemmConfig
from gemmtune.files import write_atomically
from gemmtune.kernels.signature import KernelSignature
from gemmtune.processes import main_script_hidden

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileJob:
    config: GemmConfig
    signature: KernelSignature

    @property
    def name(self) -> str:
        return Path(kernel_file_name(self.config, self.signature)).stem


@dataclass(frozen=True)
class CompileOutcome:
    job: CompileJob
    path: Path | None
    compile_s: float
    error: str | None = None


def _init_worker(target: str) -> None:
    os.environ["CUTE_DSL_ARCH"] = target


def _compile_one(config_json: str, signature: dict, out_dir: str) -> tuple[str, float]:
    from gemmtune.kernels.build import compile_gemm, export_gemm

    job = CompileJob(GemmConfig.from_json(config_json), KernelSignature(**signature))
    kernel = compile_gemm(job.config, job.signature)
    path = Path(out_dir) / kernel_file_name(job.config, job.signature)
    write_atomically(path, lambda tmp: export_gemm(kernel, tmp))
    return str(path), kernel.compile_s


def _inspect_one(config_json: str, signature: dict):
    from gemmtune.kernels.build import inspect_gemm

    return inspect_gemm(GemmConfig.from_json(config_json), KernelSignature(**signature))


def _pool(jobs: list[CompileJob], target: str, workers: int | None) -> ProcessPoolExecutor:
    workers = workers or max(1, min(len(jobs), (os.cpu_count() or 2) - 1))
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(target,),
    )


def _args(job: CompileJob) -> tuple[str, dict]:
    return job.config.to_json(), dataclasses.asdict(job.signature)


def compile_iter(
    jobs: list[CompileJob],
    out_dir: Path,
    *,
    target: str = "sm_90a",
    workers: int | None = None,
    timeout_s: float = 300.0,
) -> Iterator[CompileOutcome]:
    """Compile `jobs` in parallel into `out_dir`, yielding each outcome as it completes (so
    the caller can benchmark while the rest compile); failures are yielded, not raised. A
    compile that outlives `timeout_s` is reported failed and its worker is stopped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not jobs:
        return
    pool = _pool(jobs, target, workers)
    with main_script_hidden():  # processes start as jobs are submitted
        futures = {pool.submit(_compile_one, *_args(job), str(out_dir)): job for job in jobs}
    rounds = -(-len(jobs) // pool._max_workers)
    hung = False
    try:
        for future in as_completed(futures, timeout=timeout_s * rounds):
            job = futures[future]
            try:
                path, seconds = future.result()
                yield CompileOutcome(job, Path(path), seconds)
            except Exception as exc:  # a compile error, or the worker died
                log.warning("compile of %s failed: %s", job.name, exc)
                yield CompileOutcome(job, None, 0.0, f"{type(exc).__name__}: {exc}")
    except TimeoutError:
        hung = True
        for future, job in futures.items():
            if not future.done():
                yield CompileOutcome(job, None, 0.0, f"compile took over {timeout_s:.0f} s")
    finally:
        pool.shutdown(wait=not hung, cancel_futures=True)
        if hung:  # the executor cannot cancel a running call: stop its processes
            for process in list(pool._processes.values()):
                process.kill()


def compile_all(
    jobs: list[CompileJob], out_dir: Path, *, target: str = "sm_90a", workers: int | None = None
) -> list[CompileOutcome]:
    """Compile `jobs` in parallel into `out_dir`; failures are reported, not raised."""
    return list(compile_iter(jobs, out_dir, target=target, workers=workers))


def inspect_all(
    jobs: list[CompileJob], *, target: str = "sm_90a", workers: int | None = None
) -> list:
    """`kernels.build.inspect_gemm` for every job, in parallel, in job order."""
    with _pool(jobs, target, workers) as pool, main_script_hidden():
        return list(pool.map(_inspect_one, *zip(*(_args(job) for job in jobs), strict=True)))
