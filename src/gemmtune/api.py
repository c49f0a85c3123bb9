"""`tuned_gemm`: a @ b by the best kernel for the problem on this GPU, and its modes.

    tuned_gemm(a, b)
      plan cache (this process)     tensor facts -> kernel + launch arguments: a hit is a dict
                                    lookup, an alignment check and a launch
      on a miss: GemmProblem        validate; unsupported -> torch.matmul (reason logged once)
                 ResultsCache       bucket key -> best config (level 2: dict, then SQLite)
                 tune()             on a cache miss, in mode "tune"; the result is stored
                 KernelCache        config -> compiled kernel (level 1: dict, disk, compile)

Modes (`mode=` or `GEMMTUNE_MODE`): "tune" (default: tune on a miss, then cache),
"cache-only" (never tune: on a miss the ranking model's first choice, for production),
"heuristic" (always the ranking model's first choice), "off" (torch.matmul).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gemmtune.cache.buckets import BucketPolicy, Environment, bucket_key
from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.config import GemmConfig
from gemmtune.problem import ALIGNMENT_BYTES, GemmProblem, fallback_matmul

log = logging.getLogger(__name__)

MODE_ENV = "GEMMTUNE_MODE"
MODES = ("tune", "cache-only", "heuristic", "off")


def resolve_mode(mode: str | None) -> str:
    mode = mode or os.environ.get(MODE_ENV, "tune")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)} (mode= or {MODE_ENV})")
    return mode


def current_environment(device_index: int) -> Environment:
    """The GPU and software a result is tuned for."""
    import importlib.metadata as metadata

    import gemmtune
    from gemmtune.device import device_info

    info = device_info(device_index)
    dsl = metadata.version("nvidia-cutlass-dsl")
    return Environment(info.name, info.sm_count, gemmtune.__version__, dsl)


@dataclass
class Plan:
    """Everything a launch for one tensor signature needs, found once."""

    function: object  # the compiled kernel's launcher
    args: tuple  # what follows (a, b, out): workspace, runtime arguments
    config: GemmConfig


class Dispatcher:
    """The state behind `tuned_gemm`: caches, and how a config is chosen."""

    def __init__(
        self,
        results: ResultsCache | None = None,
        policy: BucketPolicy | None = None,
        tuner: Callable[[GemmProblem], object] | None = None,
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

    def _results(self) -> ResultsCache:
        if self.results is None:
            self.results = ResultsCache()
        return self.results

    def config_for(self, problem: GemmProblem, mode: str) -> GemmConfig:
        """The config `mode` picks for a supported problem."""
        if mode in ("tune", "cache-only"):
            key = bucket_key(problem, self.environment(problem.device.index or 0), self.policy)
            record = self._results().lookup(key)
            if record is not None:
                return record.gemm_config
            if mode == "tune":
                return self._tune(problem, key)
        return self._first_choice(problem)

    def _tune(self, problem: GemmProblem, key: str) -> GemmConfig:
        tuner = self.tuner or self._default_tuner
        result = tuner(problem)
        if result.best is None:
            log.warning("tuning found no working kernel; using the ranking model's first choice")
            return self._first_choice(problem)
        timed = sorted((r for r in result.results if r.ok), key=lambda r: r.final_ms or r.ms)
        record = TunedRecord(
            config=result.best.key,
            ms=result.best_ms,
            runners_up=tuple((r.config.key, r.final_ms or r.ms) for r in timed[1:4]),
            how=f"tuned: {len(result.results)} of {result.candidates} candidates timed",
            shape=(problem.m, problem.n, problem.k, problem.l),
        )
        self._results().store(key, record)
        return result.best

    def _default_tuner(self, problem: GemmProblem):
        from gemmtune.tuner import tune

        return tune(problem, kernel_dir=self._kernels(problem).folder)

    @staticmethod
    def _first_choice(problem: GemmProblem) -> GemmConfig:
        from gemmtune.space import candidates
        from gemmtune.space.ranking import RankingModel
        from gemmtune.tuner import device_model_for

        model = RankingModel(device_model_for(problem))
        return model.top_k(problem, candidates(problem), 1)[0]

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
        kernel = self._kernels(problem).get(config, KernelSignature.of(problem))
        p = problem
        args = launch_args(config, p.device, p.m, p.n, p.k, p.l)
        return Plan(kernel.function, args, config)

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
        if plan is None or _misaligned(a, b, out):
            return fallback_matmul(a, b, out, out_dtype)
        if out is None:
            shape = (*a.shape[:-1], b.shape[-1])
            out = torch.empty(shape, dtype=out_dtype or a.dtype, device=a.device)
        plan.function(a, b, out, *plan.args)
        return out


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
