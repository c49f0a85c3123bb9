"""The tuner: from a problem to its fastest correct config.

    space.candidates(problem)           every valid config
    ranking model                       the top k by predicted time (or all: exhaustive)
    compile workers                     their binaries, in parallel; none the kernel cache holds
    benchmark worker                    ... while each finished one is verified, then timed
    cluster sweep                       the best binaries' other cluster shapes, compiled, timed
    runtime sweep                       raster x swizzle on the best binaries: launches only
    final                               the close leaders again, each alone in windows in turn
    -> TuneResult                       the best config, and what happened to every candidate

The compile workers and the benchmark worker belong to the process (`gemmtune.workers`): the
first tune starts them (their imports and the CUDA context overlap the ranking), later tunes
find them ready. Compiling and timing overlap: the worker times each binary as soon as it is
compiled. A candidate that fails to compile, computes a wrong result, faults or hangs is
recorded as failed and never chosen; the caller's process is never at risk.

Timed one after another, candidates meet different clocks as the GPU warms, so the finalists
are decided in windows taken in turn: each runs alone, at the clocks its own power allows at
the cap, as the caller will run it (interleaving them run by run flatters the one that spends
more energy per FLOP: `measure.timing.time_in_windows`). The first pass is short (10 runs after
a 10 ms warm-up) and reads large GEMMs at the power cap 3-11 % slower than the final does, by a
different amount per config: so up to `FINALISTS` leaders within `FINAL_MARGIN` of the best
first-pass time go to the final, not only those the first pass sees as tied, each binary's
fastest order before any binary's second (`finalists_of`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from gemmtune.core.config import CUBLAS, SWIZZLES, GemmConfig, Raster
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels.schedule_model import TileGrid
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.runner import CompareJob, Measurement, ProblemSpec, RunJob, placements_for
from gemmtune.space import candidates, refusal
from gemmtune.space.ranking import DeviceModel, RankingModel, in_first_order
from gemmtune.workers.bench import DEFAULT_RUNNER, BenchWorker
from gemmtune.workers.compiler import CompileJob, CompileOutcome, compile_iter

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


#: How much faster than torch.matmul our best kernel must be, in the final, to replace it. A
#: smaller lead is within the noise between the final and a later benchmark of the same pair,
#: a coin toss; losing it costs a caller less than running slower than the library they would
#: have used.
CUBLAS_MARGIN = 0.01
#: How far behind the best first-pass time a config may be and still reach the final, and how
#: many reach it. A first-pass time lands 3-11 % above its final one on a 4096^3 GEMM at the
#: power cap, differently per config (`docs/tuning.md`): a narrower margin left the best config
#: out of the final.
FINAL_MARGIN = 0.10
FINALISTS = 4
#: Where the final puts our best kernel and torch.matmul within this much of each other, the
#: two are timed again, alone side by side (`CONFIRM_ROUNDS` rounds, the order alternating, in
#: windows of `CONFIRM_WINDOW_MS`, the benchmark's), and that timing's ratio between them
#: decides. A final's torch.matmul time of a long GEMM at the power cap moves by up to 9 % from
#: what the benchmark of the same pair reads right after (H200, serving and public suites:
#: 2999 x 28672 x 4096 bf16 and fp8, 4096 x 28672 x 4096 fp8, 1537 x 4096 x 14336 bf16 read it
#: 4.7-9.4 % slow), and a kernel 2-3 % slower than torch.matmul had won those buckets.
CONFIRM_MARGIN = 0.10
CONFIRM_ROUNDS = 4
CONFIRM_WINDOW_MS = 100.0
#: The swizzles the runtime sweep tries, at both raster orders: plain order (1) and bands of 8
#: tiles (the first pass's). Which of the two is faster depends on the shape; narrower bands
#: time like bands of 8, so they are not tried.
SWEEP_SWIZZLES = (1, 8)


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
    compile_s: float  # compile time summed over the workers
    bench_s: float  # time spent verifying and timing
    wall_s: float
    kernel_paths: dict[str, Path] = field(default_factory=dict)
    cublas_ms: float | None = None  # torch.matmul, in the final with the finalists
    cached_binaries: int = 0  # binaries the kernel cache held (not compiled)
    #: seconds from the start of the tune to each step: "ranked", "first_binary" (compiled),
    #: "worker_ready", "first_pass" (every binary compiled and timed), "cluster_sweep",
    #: "sweep", "final_start", "final"
    timeline: dict[str, float] = field(default_factory=dict)

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
    from gemmtune.core.device import device_info, max_active_clusters

    index = problem.device.index or 0
    info = device_info(index)
    resident = {size: max_active_clusters(size, index) for size in (1, 2, 4)}
    return DeviceModel.for_gpu(info.name, info.sm_count, resident)


def operand_placements(problem: GemmProblem, model: RankingModel) -> int:
    """On how many placements of its operands a problem's candidates are timed
    (`measure.runner`): several where the problem is memory-bound, whose kernels' times can
    depend on where the operands lie (the runner makes as many as the GPU's free memory
    allows); one otherwise."""
    if not model.memory_bound(problem):
        return 1
    p = problem
    return placements_for(p.l * (p.m * p.k * p.a_dtype.itemsize + p.k * p.n * p.b_dtype.itemsize))


def order_matters(config: GemmConfig, problem: GemmProblem) -> bool:
    """Whether raster order and swizzle can change `config`'s time on `problem`: wherever it has
    more than one work unit. Even in a single round, where every tile runs at once, the order
    decides which clusters are neighbours, and neighbours load the operand slices they share at
    the same time: on an H200, 2048 x 1024 x 8192 in 128x128 tiles in clusters of 2x1 (64
    clusters, one round) ran 47.0 µs along M in bands of 1 or along N in bands of 8, and 52.7
    µs the other two ways (cuBLAS 46.6)."""
    return TileGrid.of(config, problem.m, problem.n, problem.l).work_units > 1


def _default_kernel_dir(problem: GemmProblem) -> Path:
    from gemmtune.cache.kernels import KernelCache

    return KernelCache(problem.arch.compile_target).folder


def tune(
    problem_or_a: GemmProblem | torch.Tensor,
    b: torch.Tensor | None = None,
    *,
    top_k: int = 8,
    exhaustive: bool = False,
    sweep: int = 2,
    finalists: int = FINALISTS,
    warmup_ms: float = 10.0,
    runs: int = 10,
    final_window_ms: float = 30.0,
    final_rounds: int = 3,
    graph: bool = False,
    kernel_dir: Path | str | None = None,
    compiler: Compiler | None = None,
    runner: str = DEFAULT_RUNNER,
    model: RankingModel | None = None,
    configs: list[GemmConfig] | None = None,
    run_timeout_s: float = 60.0,
    progress: bool = True,
    cublas: bool = False,
    final_margin: float = FINAL_MARGIN,
) -> TuneResult:
    """Find the fastest correct config for a problem (or for `a @ b`).

    The ranking model's `top_k` configs are compiled and timed in bands (`in_first_order`;
    `exhaustive`: every valid binary, at every split count; `configs`: exactly these, as
    given), then (from the top k) the other cluster shapes of the `sweep` best binaries within
    `final_margin` of the best, where the problem is memory-bound or they are one wave of work,
    are compiled and timed the same way (`cluster_variants`), then
    the `sweep` best binaries within `final_margin` of the best are timed at every raster order
    and at the `SWEEP_SWIZZLES` where the order can matter (`order_matters`; each candidate:
    `warmup_ms`, longer after the GPU sat idle
    (`measure.timing.IDLE_WARMUP_MS`), then the median of `runs` runs, kept short so that the
    GPU's clocks move little from one to the next), and at most `finalists` leaders
    within `final_margin` of the best each alone in windows of `final_window_ms` taken in turn
    `final_rounds` times; `graph` times CUDA-graph replays (what a caller that captures its
    model in a graph sees); `cublas` adds torch.matmul to the final (`TuneResult.backend` says
    who won). Binaries are read from and written to `kernel_dir` (by default the kernel
    cache's folder, so nothing it holds is compiled again). `compiler`, `runner` and `model`
    are for tests and experiments.
    """
    from gemmtune import workers

    start = time.perf_counter()
    problem = _problem_of(problem_or_a, b)
    if not problem.supported:
        raise ValueError(f"no gemmtune kernel serves this problem: {problem.fallback_reason}")
    # the helpers import torch and the DSL while the candidates are ranked; the benchmark
    # worker, whose start is the longer, starts first
    worker = workers.bench_worker(problem.device.index or 0)
    worker.start()
    pool = None if compiler else workers.compile_pool(problem.arch.compile_target)
    if pool is not None:
        pool.reserve(len(configs) if configs is not None else top_k)
    model = model or RankingModel(device_model_for(problem))
    with worker.lease(run_timeout_s=run_timeout_s):
        spec = ProblemSpec(
            problem.m,
            problem.n,
            problem.k,
            problem.l,
            KernelSignature.of(problem),
            problem.device.index or 0,
            copied=problem.copied,
            placements=operand_placements(problem, model),
        )
        setup = _Setup(worker, runner, spec)  # runs while the first kernels compile
        tuning = _Tuning(problem, worker, setup, model, progress, start)
        chosen = tuning.choose(configs, exhaustive, top_k)
        out_dir = Path(kernel_dir) if kernel_dir is not None else _default_kernel_dir(problem)

        def compiled(chosen: list[GemmConfig]) -> Iterator[CompileOutcome]:
            jobs = tuning.jobs(chosen)
            return (
                compile_iter(jobs, out_dir, pool) if compiler is None else compiler(jobs, out_dir)
            )

        outcomes = compiled(chosen)
        try:
            timing = RunJob("", "", warmup_ms, runs, graph)
            tuning.first_pass(outcomes, timing)
            if configs is None and not exhaustive:
                tuning.first_pass(compiled(tuning.cluster_variants(sweep, final_margin)), timing)
                tuning.mark("cluster_sweep")
            tuning.sweep(sweep, final_margin, timing)
            final = CompareJob((), (), final_window_ms, final_rounds, graph)
            tuning.final(finalists, final_margin, cublas, final)
        finally:
            tuning.bar.close()
            setup.thread.join()
    return tuning.result(time.perf_counter() - start)


class _Setup:
    """The runner's set-up (worker start, inputs, reference) in a thread of its own."""

    def __init__(self, worker: BenchWorker, runner: str, spec: ProblemSpec):
        self.error: BaseException | None = None

        def set_up() -> None:
            try:
                worker.setup(runner, spec)
            except BaseException as exc:  # re-raised in the caller's thread by `wait`
                self.error = exc

        self.thread = threading.Thread(target=set_up, daemon=True)
        self.thread.start()

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class _Tuning:
    """One tune's state between its phases."""

    def __init__(
        self,
        problem: GemmProblem,
        worker: BenchWorker,
        setup: _Setup,
        model: RankingModel,
        progress: bool,
        start: float,
    ):
        self.problem = problem
        self.start = start
        self.timeline: dict[str, float] = {}
        self.worker = worker
        self.setup = setup
        self.device = model.device
        self.model = model
        self.results: list[CandidateResult] = []
        self.groups: dict[str, list[GemmConfig]] = {}  # configs by binary
        self.space: list[GemmConfig] = []
        self.doubted: set[str] = set()  # binaries the ranking added beyond its top k
        self.paths: dict[str, Path] = {}
        self.predicted: dict[str, float] = {}
        self.space_size = 0
        self.compiled = self.cached = 0
        self.compile_s = self.bench_s = 0.0
        self.cublas_ms: float | None = None
        self.bar = tqdm(total=0, disable=not progress, desc="gemmtune tune", unit="cfg")

    def mark(self, step: str) -> None:
        self.timeline.setdefault(step, round(time.perf_counter() - self.start, 3))

    def choose(
        self, configs: list[GemmConfig] | None, exhaustive: bool, top_k: int
    ) -> list[GemmConfig]:
        space = candidates(self.problem, orders=False)
        self.space_size = len(space) * len(Raster) * len(SWIZZLES)
        if configs is not None:
            chosen = []
            for config in configs:
                reason = refusal(config, self.problem)
                if reason is None:
                    chosen.append(config)
                else:
                    error = f"cannot serve this problem: {reason}"
                    self.results.append(CandidateResult(config, None, None, error=error))
        else:
            picked = space if exhaustive else self.model.top_k(self.problem, space, top_k)
            chosen = [self.model.first_order(self.problem, c) for c in picked]
            # what `top_k` adds after its k are configs the model is known to misjudge
            self.doubted = {c.compile_key for c in picked[top_k:]} if not exhaustive else set()
        self.space = space
        self.predicted = {c.key: self.model.predict_us(self.problem, c) for c in chosen}
        self.bar.total = len(chosen)
        self.mark("ranked")
        p = self.problem
        log.info(
            "tuning %dx%dx%dx%d %s: %d candidates, timing %d on %d binaries",
            *(p.m, p.n, p.k, p.l),
            KernelSignature.of(p).key,
            self.space_size,
            len(chosen),
            len({c.compile_key for c in chosen}),
        )
        return chosen

    def jobs(self, chosen: list[GemmConfig]) -> list[CompileJob]:
        """One compile job per binary of `chosen` that this tune has not met before."""
        new: dict[str, list[GemmConfig]] = {}
        for config in chosen:
            group = self.groups.get(config.compile_key)
            if group is None:
                group = new.setdefault(config.compile_key, [])
            group.append(config)
        self.groups.update(new)
        signature = KernelSignature.of(self.problem)
        return [CompileJob(group[0], signature) for group in new.values()]

    def cluster_variants(self, binaries: int, margin: float) -> list[GemmConfig]:
        """The other cluster shapes the space offers for the best `binaries` binaries within
        `margin` of the best first-pass time, each predicted within `margin` of its leader;
        where the problem is compute-bound, only for leaders whose work is one wave
        (`RankingModel.one_wave`): on problems of many waves the families' fitted constants,
        measured on such problems, order the cluster shapes, and the round of compiles
        (2.3-3 s a tune on 4096^2 outputs, H200) found nothing.
        The model sees little between a tile's cluster shapes and gives them one place in the
        top k (`shortlist.tie_key`), yet timed they differ by 5-10 % on decode batches (clusters
        of four along a weight's rows lead some, unclustered tiles others)."""
        ok = sorted((r for r in self.results if r.ok), key=lambda r: r.ms)
        leaders: dict[str, GemmConfig] = {}
        for r in ok:
            if len(leaders) == binaries or r.ms > ok[0].ms * (1 + margin):
                break
            leaders.setdefault(r.config.compile_key, in_first_order(r.config))
        if not self.model.memory_bound(self.problem):
            leaders = {key: c for key, c in leaders.items() if self.model.one_wave(self.problem, c)}
        variants: dict[GemmConfig, None] = {}
        for leader in leaders.values():
            limit = self.model.predict_us(self.problem, leader) * (1 + margin)
            tile = _all_but_cluster_and_order(leader)
            for config in self.space:
                # the tile's size first: comparing every field of the 18,000 configs of a
                # space took 0.06 s of Python per leader
                if config.tile_n != leader.tile_n or config.tile_m != leader.tile_m:
                    continue
                if _all_but_cluster_and_order(config) != tile:
                    continue
                variant = self.model.first_order(self.problem, config)
                if variant.compile_key in self.groups:
                    continue
                predicted = self.model.predict_us(self.problem, variant)
                if predicted <= limit:
                    variants[variant] = None
                    self.predicted[variant.key] = predicted
        self.bar.total += len(variants)
        return list(variants)

    def _measure(self, config: GemmConfig, options: RunJob) -> CandidateResult:
        t0 = time.perf_counter()
        job = dataclasses.replace(
            options, config_json=config.to_json(), kernel_path=str(self.paths[config.compile_key])
        )
        m = self.worker.measure(job, config.key)
        self.bench_s += time.perf_counter() - t0
        self.bar.update(1)
        return _result(config, self.predicted.get(config.key), m)

    def first_pass(self, outcomes: Iterator[CompileOutcome], options: RunJob) -> None:
        """Each binary's configs, verified and timed as soon as it is compiled."""
        for outcome in outcomes:
            self.mark("first_binary")
            self.compile_s += outcome.compile_s
            group = self.groups[outcome.job.config.compile_key]
            if outcome.path is None:
                for config in group:
                    error = f"compile: {outcome.error}"
                    self.results.append(
                        CandidateResult(config, self.predicted[config.key], None, error=error)
                    )
                self.bar.update(len(group))
                continue
            self.cached += outcome.cached
            self.compiled += not outcome.cached
            self.paths[outcome.job.config.compile_key] = outcome.path
            self.setup.wait()
            self.mark("worker_ready")
            self.results.extend(self._measure(config, options) for config in group)
        self.mark("first_pass")

    def sweep(self, binaries: int, margin: float, options: RunJob) -> None:
        """The best `binaries` within `margin` of the best at every raster order and
        `SWEEP_SWIZZLES`, where order can matter."""
        timed = {r.config.key for r in self.results}
        ok = sorted((r for r in self.results if r.ok), key=lambda r: r.ms)
        best = [r for r in ok[:binaries] if r.ms <= ok[0].ms * (1 + margin)]
        variants = [
            v
            for r in best
            if order_matters(r.config, self.problem)
            for raster in Raster
            for swizzle in SWEEP_SWIZZLES
            if (v := r.config.with_runtime(raster=raster, swizzle=swizzle)).key not in timed
        ]
        self.bar.total += len(variants)
        self.results.extend(self._measure(config, options) for config in variants)
        self.mark("sweep")

    def final(self, finalists: int, margin: float, cublas: bool, options: CompareJob) -> None:
        """The leaders within `margin` of the best (`finalists_of`; and torch.matmul), each
        alone in windows taken in turn."""
        leaders = finalists_of(self.results, finalists, margin, self.doubted)
        if not (len(leaders) > 1 or (cublas and leaders)):
            return
        self.mark("final_start")
        t0 = time.perf_counter()
        extra = (CUBLAS,) if cublas else ()
        job = dataclasses.replace(
            options,
            configs_json=tuple(r.config.to_json() for r in leaders) + extra,
            kernel_paths=tuple(str(self.paths[r.config.compile_key]) for r in leaders) + extra,
        )
        final = self.worker.compare(job, [r.config.key for r in leaders] + list(extra))
        for r, m in zip(leaders, final, strict=False):
            self.results[self.results.index(r)] = dataclasses.replace(r, final_ms=m.ms)
        if cublas:
            self.cublas_ms = final[-1].ms
            self._confirm(options)
        self.bench_s += time.perf_counter() - t0
        self.mark("final")

    def _confirm(self, options: CompareJob) -> None:
        """Our best finalist and torch.matmul once more, alone side by side, where the final
        put them within `CONFIRM_MARGIN` of each other: torch.matmul's time becomes our best's
        final time over the ratio of the two in that timing (the finalists keep the times
        the final compared them by)."""
        decided = [r for r in self.results if r.final_ms is not None]
        if not decided or self.cublas_ms is None:
            return
        best = min(decided, key=lambda r: r.final_ms)
        if abs(best.final_ms / self.cublas_ms - 1) >= CONFIRM_MARGIN:
            return
        job = dataclasses.replace(
            options,
            configs_json=(best.config.to_json(), CUBLAS),
            kernel_paths=(str(self.paths[best.config.compile_key]), CUBLAS),
            rounds=CONFIRM_ROUNDS,
            window_ms=max(options.window_ms, CONFIRM_WINDOW_MS),
        )
        ours, cublas = self.worker.compare(job, [best.config.key, CUBLAS])
        if ours.ms is None or cublas.ms is None:
            return
        self.cublas_ms = best.final_ms * cublas.ms / ours.ms

    def result(self, wall_s: float) -> TuneResult:
        ok = [r for r in self.results if r.ok]
        decided = [r for r in ok if r.final_ms is not None]
        best = min(decided or ok, key=lambda r: r.final_ms if decided else r.ms) if ok else None
        if best is None:
            log.warning("no candidate of %d ran correctly", len(self.results))
        return TuneResult(
            problem=self.problem,
            best=best.config if best else None,
            best_ms=(best.final_ms or best.ms) if best else None,
            reference_error=best.rel_err if best else None,
            results=self.results,
            candidates=self.space_size,
            compiled=self.compiled,
            compile_s=self.compile_s,
            bench_s=self.bench_s,
            wall_s=wall_s,
            kernel_paths=self.paths,
            cublas_ms=self.cublas_ms,
            cached_binaries=self.cached,
            timeline=self.timeline,
        )


def finalists_of(
    results: list[CandidateResult],
    count: int,
    margin: float,
    doubted: frozenset[str] | set[str] = frozenset(),
) -> list[CandidateResult]:
    """The final's entrants: of the correct results within `margin` of the best first-pass
    time, the fastest of each binary first, then the other orders of those binaries, fastest
    first; `count` in all, and beyond them the fastest of each `doubted` binary within
    `margin`. Those are what the ranking adds after its top k, configs it is known to
    misjudge; the first pass reads a large 8-bit GEMM 0-14 % above its final time, differently
    per binary, and left them out of a final of four they would have won (fp8 4096^3 per row,
    128x128 ping-pong). The final exists to correct the first pass, whose error comes with
    a binary (its clocks at the power cap, its warm-up) more than with its order, so its places
    go first to telling binaries apart. Taken by first-pass time alone, they went to orders of
    one binary: on an H200, `x @ w` for 1 x 57344 x 8192 bf16 put three orders of a swapped
    128x16 tile and one of its 1x2 cluster twin in the final, 8 x 28672 x 4096 three orders of
    its cooperative 128x16 and one ping-pong, all within 0.7 % of each other, where other
    binaries had timed within 2 %."""
    ok = sorted((r for r in results if r.ok), key=lambda r: r.ms)
    close = [r for r in ok if r.ms <= ok[0].ms * (1 + margin)] if ok else []
    binaries: set[str] = set()
    firsts, orders = [], []
    for r in close:
        key = r.config.compile_key
        (orders if key in binaries else firsts).append(r)
        binaries.add(key)
    chosen = (firsts + orders)[:count]
    left_out = doubted - {r.config.compile_key for r in chosen}
    return chosen + [r for r in firsts if r.config.compile_key in left_out]


#: What a tile's cluster variants share: every field of its config but the cluster shape and
#: the order (a 2-CTA config has no 1x1 twin to compare through `dataclasses.replace`).
_TILE_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(GemmConfig)
    if f.name not in ("cluster_m", "cluster_n", "raster", "swizzle")
)


def _all_but_cluster_and_order(config: GemmConfig) -> tuple:
    return tuple(getattr(config, name) for name in _TILE_FIELDS)


def _result(config: GemmConfig, predicted: float | None, m: Measurement) -> CandidateResult:
    if m.error:
        log.info("%s failed: %s", config.key, m.error)
    return CandidateResult(config, predicted, m.ms, m.rel_err, m.error)
