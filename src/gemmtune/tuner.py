"""The tuner: from a problem to its fastest correct config.

    space.candidates(problem)           every valid config
    ranking model                       the top k by predicted time (or all: exhaustive)
    compile pool (processes)            their binaries, in parallel ...
    benchmark worker (process)          ... while each finished one is verified, then timed
    runtime sweep                       raster x swizzle on the best binaries: launches only
    final                               the best few again, each alone in windows taken in turn
    -> TuneResult                       the best config, and what happened to every candidate

Compiling and timing overlap: the worker times each binary as soon as it is compiled. A
candidate that fails to compile, computes a wrong result, faults or hangs is recorded as
failed and never chosen; the caller's process is never at risk (`bench/worker.py`). Timed one
after another, candidates meet different clocks as the GPU warms (5% apart on a long, large
GEMM), so the finalists are decided in windows taken in turn: each runs alone, at the clocks
its own power allows at the cap, as the caller will run it (interleaving them run by run
flatters the one that spends more energy per FLOP: `bench.timing.time_in_windows`).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from gemmtune.bench.runner import CompareJob, Measurement, ProblemSpec, RunJob
from gemmtune.bench.worker import DEFAULT_RUNNER, BenchWorker
from gemmtune.compile_pool import CompileJob, CompileOutcome, compile_iter
from gemmtune.config import CUBLAS, SWIZZLES, GemmConfig, Raster
from gemmtune.kernels.signature import KernelSignature
from gemmtune.problem import GemmProblem
from gemmtune.space import candidates
from gemmtune.space.ranking import DeviceModel, RankingModel, in_first_order

log = logging.getLogger(__name__)

Compiler = Callable[[list[CompileJob], Path], Iterator[CompileOutcome]]


@dataclass(frozen=True)
class CandidateResult:
    """What became of one candidate: its time, or why it has none."""

    config: GemmConfig
    predicted_us: float | None
    ms: float | None
    rel_err: float | None = None
    error: str | None = None
    final_ms: float | None = None  # its time in the final (windows taken in turn)

    @property
    def ok(self) -> bool:
        return self.ms is not None


#: How much faster than torch.matmul our best kernel must be, in the final, to replace it. The
#: final's windows and a later benchmark of the same pair differ by up to 1.5 % on an H200 at
#: its power cap (l8b_down_4k: ours chosen, then 0.9875 of cuBLAS in `gemmtune bench`), so a
#: smaller lead is a coin toss; losing it costs a caller less than running slower than the
#: library they would have used.
CUBLAS_MARGIN = 0.01


@dataclass
class TuneResult:
    """The outcome of tuning one problem."""

    problem: GemmProblem
    best: GemmConfig | None
    best_ms: float | None
    reference_error: float | None
    results: list[CandidateResult]
    candidates: int
    compiled: int
    compile_s: float  # compile time summed over the pool's workers
    bench_s: float  # time spent verifying and timing
    wall_s: float
    kernel_paths: dict[str, Path] = field(default_factory=dict)
    cublas_ms: float | None = None  # torch.matmul, in the final with the finalists

    @property
    def backend(self) -> str:
        """What won: "gemmtune" (`best`), or "cublas" where torch.matmul ran in the final and
        our best did not beat it by `CUBLAS_MARGIN`."""
        if self.cublas_ms is None:
            return "gemmtune"
        if self.best_ms is None or self.best_ms > self.cublas_ms * (1 - CUBLAS_MARGIN):
            return CUBLAS
        return "gemmtune"

    @property
    def best_tflops(self) -> float | None:
        if self.best_ms is None:
            return None
        return self.problem.flops / (self.best_ms * 1e-3) / 1e12

    @property
    def failures(self) -> list[CandidateResult]:
        return [r for r in self.results if not r.ok]


def _problem_of(problem_or_a: GemmProblem | torch.Tensor, b: torch.Tensor | None) -> GemmProblem:
    if isinstance(problem_or_a, GemmProblem):
        return problem_or_a
    if b is None:
        raise TypeError("tune takes a GemmProblem, or the tensors a and b")
    return GemmProblem.from_tensors(problem_or_a, b)


def device_model_for(problem: GemmProblem) -> DeviceModel:
    """The ranking model's view of the problem's GPU (measured on it when there is one)."""
    if not torch.cuda.is_available():
        return DeviceModel()
    from gemmtune.device import device_info, max_active_clusters

    index = problem.device.index or 0
    info = device_info(index)
    resident = {size: max_active_clusters(size, index) for size in (1, 2, 4)}
    return DeviceModel.for_gpu(info.name, info.sm_count, resident)


def tune(
    problem_or_a: GemmProblem | torch.Tensor,
    b: torch.Tensor | None = None,
    *,
    top_k: int = 8,
    exhaustive: bool = False,
    sweep: int = 2,
    finalists: int = 5,
    warmup_ms: float = 25.0,
    runs: int = 20,
    final_window_ms: float = 50.0,
    final_rounds: int = 3,
    graph: bool = False,
    kernel_dir: Path | str | None = None,
    compile_workers: int | None = None,
    compiler: Compiler | None = None,
    runner: str = DEFAULT_RUNNER,
    model: RankingModel | None = None,
    configs: list[GemmConfig] | None = None,
    run_timeout_s: float = 60.0,
    progress: bool = True,
    cublas: bool = False,
) -> TuneResult:
    """Find the fastest correct config for a problem (or for `a @ b`).

    The ranking model's `top_k` configs are compiled and timed in bands (`in_first_order`;
    `exhaustive`: every valid binary, at every split count; `configs`: exactly these, as
    given), then the `sweep` best binaries are timed at every raster order and swizzle (each
    candidate: `warmup_ms`, longer after the GPU sat idle (`bench.timing.IDLE_WARMUP_MS`),
    then the median of `runs` runs, kept short so that the GPU's clocks move little from one
    to the next), and the `finalists` best each alone in windows of `final_window_ms` taken
    in turn `final_rounds` times; `graph` times CUDA-graph replays (what a caller that captures
    its model in a graph sees); `cublas` adds torch.matmul to the final (`TuneResult.backend`
    says who won). Kernels are written to `kernel_dir` (a temporary folder by default).
    `compiler`, `runner` and `model` are for tests and experiments.
    """
    start = time.perf_counter()
    problem = _problem_of(problem_or_a, b)
    if not problem.supported:
        raise ValueError(f"no gemmtune kernel serves this problem: {problem.fallback_reason}")
    space = candidates(problem)
    model = model or RankingModel(device_model_for(problem))
    defaults = [c for c in space if c.raster is Raster.ALONG_M and c.swizzle == 1]
    if configs is not None:
        chosen = list(configs)
    else:
        picked = defaults if exhaustive else model.top_k(problem, defaults, top_k)
        chosen = [in_first_order(c) for c in picked]
    predicted = {c.key: model.predict_us(problem, c) for c in chosen}
    signature = KernelSignature.of(problem)
    by_binary: dict[str, list[GemmConfig]] = {}
    for config in chosen:
        by_binary.setdefault(config.compile_key, []).append(config)
    jobs = [CompileJob(group[0], signature) for group in by_binary.values()]
    log.info(
        "tuning %dx%dx%dx%d %s: %d candidates, timing %d on %d binaries",
        problem.m,
        problem.n,
        problem.k,
        problem.l,
        signature.key,
        len(space),
        len(chosen),
        len(jobs),
    )

    temporary = tempfile.TemporaryDirectory(prefix="gemmtune-") if kernel_dir is None else None
    out_dir = Path(temporary.name if temporary else kernel_dir)
    worker = BenchWorker(runner, run_timeout_s=run_timeout_s)
    spec = ProblemSpec(
        problem.m, problem.n, problem.k, problem.l, signature, problem.device.index or 0
    )
    setup_errors: list[BaseException] = []

    def set_up() -> None:
        try:
            worker.setup(spec)
        except BaseException as exc:  # re-raised in the caller's thread below
            setup_errors.append(exc)

    # the worker starts (imports, CUDA context, inputs) while the first kernels compile
    setup = threading.Thread(target=set_up, daemon=True)
    setup.start()
    compile_s = bench_s = 0.0
    cublas_ms = None
    compiled = 0
    results: list[CandidateResult] = []
    paths: dict[str, Path] = {}
    bar = tqdm(total=len(chosen), disable=not progress, desc="gemmtune tune", unit="cfg")
    try:
        compile_fn = compiler or (
            lambda jobs, out: compile_iter(
                jobs, out, target=problem.arch.compile_target, workers=compile_workers
            )
        )
        for outcome in compile_fn(jobs, out_dir):
            compile_s += outcome.compile_s
            group = by_binary[outcome.job.config.compile_key]
            if outcome.path is None:
                for config in group:
                    results.append(
                        CandidateResult(
                            config, predicted[config.key], None, error=f"compile: {outcome.error}"
                        )
                    )
                bar.update(len(group))
                continue
            compiled += 1
            paths[outcome.job.config.compile_key] = outcome.path
            setup.join()
            if setup_errors:
                raise setup_errors[0]
            for config in group:
                t0 = time.perf_counter()
                m = worker.measure(
                    RunJob(config.to_json(), str(outcome.path), warmup_ms, runs, graph),
                    config.key,
                )
                bench_s += time.perf_counter() - t0
                results.append(_result(config, predicted[config.key], m))
                bar.update(1)
        swept = sorted((r for r in results if r.ok), key=lambda r: r.ms)[:sweep]
        variants = [
            r.config.with_runtime(raster=raster, swizzle=swizzle)
            for r in swept
            for raster in Raster
            for swizzle in SWIZZLES
        ]
        variants = [v for v in variants if v.key not in {r.config.key for r in results}]
        bar.total += len(variants)
        for config in variants:
            t0 = time.perf_counter()
            m = worker.measure(
                RunJob(config.to_json(), str(paths[config.compile_key]), warmup_ms, runs, graph),
                config.key,
            )
            bench_s += time.perf_counter() - t0
            results.append(_result(config, None, m))
            bar.update(1)
        leaders = sorted((r for r in results if r.ok), key=lambda r: r.ms)[:finalists]
        if len(leaders) > 1 or (cublas and leaders):
            t0 = time.perf_counter()
            extra = (CUBLAS,) if cublas else ()
            job = CompareJob(
                tuple(r.config.to_json() for r in leaders) + extra,
                tuple(str(paths[r.config.compile_key]) for r in leaders) + extra,
                final_window_ms,
                final_rounds,
                graph,
            )
            final = worker.compare(job, [r.config.key for r in leaders] + list(extra))
            bench_s += time.perf_counter() - t0
            for r, m in zip(leaders, final, strict=False):
                results[results.index(r)] = dataclasses.replace(r, final_ms=m.ms)
            if cublas:
                cublas_ms = final[-1].ms
    finally:
        bar.close()
        setup.join()
        worker.close()
        if temporary is not None:
            temporary.cleanup()
            paths = {}
    ok = [r for r in results if r.ok]
    decided = [r for r in ok if r.final_ms is not None]
    best = min(decided or ok, key=lambda r: r.final_ms if decided else r.ms) if ok else None
    if best is None:
        log.warning("no candidate of %d ran correctly", len(results))
    return TuneResult(
        problem=problem,
        best=best.config if best else None,
        best_ms=(best.final_ms or best.ms) if best else None,
        reference_error=best.rel_err if best else None,
        results=results,
        candidates=len(space),
        compiled=compiled,
        compile_s=compile_s,
        bench_s=bench_s,
        wall_s=time.perf_counter() - start,
        kernel_paths=paths,
        cublas_ms=cublas_ms,
    )


def _result(config: GemmConfig, predicted: float | None, m: Measurement) -> CandidateResult:
    if m.error:
        log.info("%s failed: %s", config.key, m.error)
    return CandidateResult(config, predicted, m.ms, m.rel_err, m.error)
