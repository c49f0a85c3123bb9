"""`tuned_gemm`: a @ b by the best kernel for the problem on this GPU, and its modes.

    tuned_gemm(a, b)
      plan cache (this process)     tensor facts -> kernel + launch arguments: a hit is a dict
                                    lookup, an alignment check and a launch
      on a miss: GemmProblem        validate; unsupported -> torch.matmul (reason logged once)
                 ResultsCache       bucket key -> best config (level 2: dict, then SQLite)
                 tune()             on a cache miss, in mode "tune"; the result is stored
                 KernelCache        config -> compiled kernel (level 1: dict, disk, compile)

A bucket's record keeps every config its tune timed. For a shape of the bucket other than the
one tuned, the choice among them is re-made for that shape: each measured time scaled by the
ranking model's predicted ratio between the two shapes (wave quantization and tile fit change
within a bucket; the measurement keeps what the model gets wrong about the config itself); a
runner-up replaces the winner only when it is clearly faster (`SWITCH_MARGIN`).
Tuning also times torch.matmul (cuBLAS) beside the finalists, and a bucket where our best
kernel does not beat it by `tuner.CUBLAS_MARGIN` is served by torch.matmul.

Modes (`mode=` or `GEMMTUNE_MODE`): "tune" (default: tune on a miss, then cache),
"cache-only" (never tune: on a miss the ranking model's first choice, for production),
"heuristic" (always the ranking model's first choice), "off" (torch.matmul).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import tvm_ffi  # noqa: F401  our kernels' launch runtime: loaded with gemmtune, not at a first call

from gemmtune.cache.buckets import BucketPolicy, Environment, bucket_key, current_environment
from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.core.config import CUBLAS, Decomposition, GemmConfig
from gemmtune.core.dtypes import ALIGNMENT_BYTES
from gemmtune.core.problem import GemmProblem, fallback_matmul

log = logging.getLogger(__name__)

MODE_ENV = "GEMMTUNE_MODE"
MODES = ("tune", "cache-only", "heuristic", "off")
CUBLAS_ENV = "GEMMTUNE_CUBLAS"
# how much faster, scaled to a shape, a bucket's runner-up must be than its winner to replace it:
# the runners-up were not all timed in the final, and the model's ratios are rough
SWITCH_MARGIN = 1.05


def cublas_candidate() -> bool:
    """Whether tuning times torch.matmul beside our kernels (default yes; GEMMTUNE_CUBLAS=0
    to tune our kernels only)."""
    return os.environ.get(CUBLAS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def resolve_mode(mode: str | None) -> str:
    mode = mode or os.environ.get(MODE_ENV, "tune")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)} (mode= or {MODE_ENV})")
    return mode


@dataclass
class Plan:
    """Everything a launch for one tensor signature needs, found once."""

    function: object | None  # the compiled kernel's launcher; None: torch.matmul serves
    args: tuple  # what follows (a, b, out): workspace, runtime arguments
    config: GemmConfig | None
    workspace_stream: int | None = None  # the stream whose workspace `args` holds, if any


class Dispatcher:
    """The state behind `tuned_gemm`: caches, and how a config is chosen."""

    def __init__(
        self,
        results: ResultsCache | None = None,
        policy: BucketPolicy | None = None,
        tuner: Callable[..., object] | None = None,
        environment: Callable[[int], Environment] = current_environment,
    ):
        self.results = results
        self.policy = policy or BucketPolicy.from_env()
        self.tuner = tuner
        self.environment = environment
        self.plans: dict[tuple, Plan | None] = {}
        self.kernel_caches: dict[str, object] = {}
        self.fallbacks_logged: set[str] = set()

    # -- choosing a config ------------------------------------------------------------------

    def results_cache(self) -> ResultsCache:
        if self.results is None:
            self.results = ResultsCache()
        return self.results

    def config_for(self, problem: GemmProblem, mode: str) -> GemmConfig | None:
        """The config `mode` picks for a supported problem; None when torch.matmul won."""
        if mode in ("tune", "cache-only"):
            key = self._bucket_key(problem)
            results = self.results_cache()
            record = results.lookup(key)
            if record is None and mode == "tune":
                record = results.tune_once(key, lambda: self._tuned_record(problem))
                if record is None:
                    log.warning("tuning found no working kernel; using the model's first choice")
            if record is not None:
                return self.for_shape(record, problem)
        return self._first_choice(problem)

    @staticmethod
    def for_shape(record: TunedRecord, problem: GemmProblem) -> GemmConfig | None:
        """The bucket's choice for this problem's own shape (see the module's docstring)."""
        shape = (problem.m, problem.n, problem.k, problem.l)
        measured = [(record.config, record.ms), *record.runners_up]
        if record.shape == shape or record.ms is None or len(measured) == 1:
            choice = record.config
        else:
            from gemmtune.space.ranking import RankingModel
            from gemmtune.tuning.tuner import device_model_for

            model = RankingModel(device_model_for(problem))
            m, n, k, l = record.shape
            tuned = dataclasses.replace(problem, m=m, n=n, k=k, l=l)

            def scaled_ms(entry: tuple[str, float]) -> float:
                name, ms = entry
                if name == CUBLAS:
                    return ms * model.roofline_us(problem) / model.roofline_us(tuned)
                config = GemmConfig.from_key(name)
                return ms * model.predict_us(problem, config) / model.predict_us(tuned, config)

            fastest = min(measured, key=scaled_ms)
            # another config must win by more than the noise in the measured times
            if scaled_ms(fastest) * SWITCH_MARGIN < scaled_ms(measured[0]):
                choice = fastest[0]
            else:
                choice = record.config
        return None if choice == CUBLAS else GemmConfig.from_key(choice)

    def _bucket_key(self, problem: GemmProblem) -> str:
        return bucket_key(problem, self.environment(problem.device.index or 0), self.policy)

    def tune(self, problem: GemmProblem, **options) -> object:
        """Tune `problem` now (whatever the cache holds), store the result for its bucket and
        return the `TuneResult`; `options` go to `tuner.tune` (top_k, exhaustive, ...)."""
        if not problem.supported:
            raise ValueError(f"no gemmtune kernel serves this problem: {problem.fallback_reason}")
        outcome = []
        self.results_cache().tune_once(
            self._bucket_key(problem),
            lambda: self._tuned_record(problem, outcome, **options),
            replace=True,
        )
        self.plans.clear()  # plans made before may have used what this result replaces
        return outcome[0]

    def _tuned_record(
        self, problem: GemmProblem, outcome: list | None = None, **options
    ) -> TunedRecord | None:
        """Run the tuner on `problem`: the record of its winner (a kernel, or torch.matmul),
        or None when nothing ran correctly. The `TuneResult` is appended to `outcome`."""
        result = (self.tuner or self._default_tuner)(problem, **options)
        if outcome is not None:
            outcome.append(result)
        if result.best is None and result.backend != CUBLAS:
            return None
        record = record_of(result)
        p = problem
        log.info(
            "tuned %dx%dx%dx%d: %s wins (%.4f ms)", p.m, p.n, p.k, p.l, record.config, record.ms
        )
        return record

    def _default_tuner(self, problem: GemmProblem, **options):
        from gemmtune.tuning.tuner import tune

        options.setdefault("cublas", cublas_candidate())
        return tune(problem, kernel_dir=self._kernels(problem).folder, **options)

    @staticmethod
    def _first_choice(problem: GemmProblem) -> GemmConfig:
        from gemmtune.space import candidates
        from gemmtune.space.ranking import RankingModel, in_first_order
        from gemmtune.tuning.tuner import device_model_for

        model = RankingModel(device_model_for(problem))
        return in_first_order(model.top_k(problem, candidates(problem, orders=False), 1)[0])

    def _kernels(self, problem: GemmProblem):
        from gemmtune.cache.kernels import KernelCache

        target = problem.arch.compile_target
        if target not in self.kernel_caches:
            self.kernel_caches[target] = KernelCache(target)
        return self.kernel_caches[target]

    # -- launching --------------------------------------------------------------------------

    def _plan(self, problem: GemmProblem, mode: str) -> Plan:
        from gemmtune.kernels.launch import launch_args
        from gemmtune.kernels.signature import KernelSignature

        config = self.config_for(problem, mode)
        if config is None:
            return Plan(None, (), None)
        kernel = self._kernels(problem).get(config, KernelSignature.of(problem))
        p = problem
        args = launch_args(config, p.device, p.m, p.n, p.k, p.l)
        stream = None
        if config.decomposition is not Decomposition.DATA_PARALLEL:
            stream = torch.cuda.current_stream(p.device).stream_id
        return Plan(kernel.launcher, args, config, stream)

    @staticmethod
    def _args(plan: Plan, a: torch.Tensor, b: torch.Tensor) -> tuple:
        """The plan's launch arguments, with the workspace of the current stream: kernels on
        two streams must not share one."""
        if plan.workspace_stream is None:
            return plan.args
        if torch.cuda.current_stream(a.device).stream_id == plan.workspace_stream:
            return plan.args
        from gemmtune.kernels.launch import launch_args

        batch = a.shape[0] if a.dim() == 3 else 1
        return launch_args(plan.config, a.device, a.shape[-2], b.shape[-1], a.shape[-1], batch)

    def plan(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        mode: str = "tune",
    ) -> Plan | None:
        """How `a @ b` is computed in `mode` (found once per tensor signature, tuning if the
        mode says so): a `Plan`, whose `config` is None where torch.matmul won a tuning, or
        None where our kernels do not serve the problem."""
        signature = (
            a.shape, a.stride(), a.dtype, a.device,
            b.shape, b.stride(), b.dtype,
            None if out is None else (out.shape, out.stride(), out.dtype),
            out_dtype, mode,
        )  # fmt: skip
        plan = self.plans.get(signature, False)
        if plan is False:
            problem = GemmProblem.from_tensors(a, b, out, out_dtype)
            if problem.supported:
                plan = self._plan(problem, mode)
            else:
                plan = None
                reason = problem.fallback_reason
                if reason.code not in self.fallbacks_logged:
                    self.fallbacks_logged.add(reason.code)
                    log.info("gemmtune falls back to torch.matmul: %s", reason)
            self.plans[signature] = plan
        return plan

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        mode: str | None = None,
    ) -> torch.Tensor:
        mode = resolve_mode(mode)
        if mode == "off":
            return fallback_matmul(a, b, out, out_dtype)
        plan = self.plan(a, b, out, out_dtype, mode)
        if plan is None or plan.function is None or _misaligned(a, b, out):
            return fallback_matmul(a, b, out, out_dtype)
        if out is None:
            shape = (*a.shape[:-1], b.shape[-1])
            out = torch.empty(shape, dtype=out_dtype or a.dtype, device=a.device)
        plan.function(a, b, out, *self._args(plan, a, b))
        return out


def record_of(result) -> TunedRecord:
    """What the results cache keeps of a `TuneResult`: its winner first, then the other
    finalists at their final times (comparable with the winner's), then the rest at their
    first, shorter timings (taken at other clocks, so they are never ranked against the
    finalists)."""
    ok = [r for r in result.results if r.ok]
    final = [(r.config.key, r.final_ms) for r in ok if r.final_ms is not None]
    if result.cublas_ms is not None:
        final.append((CUBLAS, result.cublas_ms))
    rest = sorted(((r.config.key, r.ms) for r in ok if r.final_ms is None), key=lambda e: e[1])
    timed = sorted(final, key=lambda entry: entry[1]) + rest
    winner = CUBLAS if result.backend == CUBLAS else result.best.key
    first = next(i for i, (key, _) in enumerate(timed) if key == winner)
    timed.insert(0, timed.pop(first))
    cublas = f", torch.matmul {result.cublas_ms:.4f} ms" if result.cublas_ms else ""
    p = result.problem
    return TunedRecord(
        config=timed[0][0],
        ms=timed[0][1],
        runners_up=tuple(timed[1:]),
        how=f"tuned: {len(result.results)} of {result.candidates} candidates timed{cublas}",
        shape=(p.m, p.n, p.k, p.l),
    )


def _misaligned(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> bool:
    """The plan was made for these strides; only the data pointers can break alignment now."""
    return bool(
        a.data_ptr() % ALIGNMENT_BYTES
        or b.data_ptr() % ALIGNMENT_BYTES
        or (out is not None and out.data_ptr() % ALIGNMENT_BYTES)
    )


DISPATCHER = Dispatcher()


def tuned_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    mode: str | None = None,
) -> torch.Tensor:
    """`a @ b` (2-D, or batched 3-D), by the best kernel for the problem on this GPU.

    On the first call for a problem's bucket it tunes (mode "tune"), then caches; afterwards it
    dispatches. What our kernels do not serve goes to torch.matmul; wrong calls raise.
    """
    return DISPATCHER(a, b, out, out_dtype, mode)
