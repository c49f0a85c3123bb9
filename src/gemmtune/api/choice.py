"""Choosing the config for a problem: the results cache's record of its bucket, a tune where
the cache has none, or the ranking model's first choice, as the mode says.

A bucket's record keeps every config its tune timed. For a shape of the bucket other than the
one tuned, the choice among them is re-made for that shape: each measured time scaled by the
ranking model's predicted ratio between the two shapes (wave quantization and tile fit change
within a bucket; the measurement keeps what the model gets wrong about the config itself); a
runner-up replaces the winner only when it is clearly faster (`SWITCH_MARGIN`).
Tuning also times torch.matmul (cuBLAS) beside the finalists, and a bucket where our best
kernel does not beat it by `tuner.CUBLAS_MARGIN` is served by torch.matmul.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

from gemmtune.cache.buckets import BucketPolicy, Environment, bucket_key, current_environment
from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.core.config import CUBLAS, GemmConfig
from gemmtune.core.problem import GemmProblem

log = logging.getLogger(__name__)

CUBLAS_ENV = "GEMMTUNE_CUBLAS"
# how much faster, scaled to a shape, a bucket's runner-up must be than its winner to replace it:
# the runners-up were not all timed in the final, and the model's ratios are rough
SWITCH_MARGIN = 1.05


def cublas_candidate() -> bool:
    """Whether tuning times torch.matmul beside our kernels (default yes; GEMMTUNE_CUBLAS=0
    to tune our kernels only)."""
    return os.environ.get(CUBLAS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class ConfigChooser:
    """Which config serves a problem: the results cache, the tuner, the ranking model."""

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

    def results_cache(self) -> ResultsCache:
        """The results cache (opened on first use)."""
        if self.results is None:
            self.results = ResultsCache()
        return self.results

    def config_for(self, problem: GemmProblem, mode: str) -> GemmConfig | None:
        """The config `mode` picks for a supported problem; None when torch.matmul won, or
        where only the model could choose on a GPU whose kernel no tune has verified."""
        if mode in ("tune", "cache-only"):
            key = self.bucket_key(problem)
            results = self.results_cache()
            record = results.lookup(key)
            if record is None and mode == "tune":
                record = results.tune_once(key, lambda: self._tuned_record(problem))
                if record is None:
                    log.warning("tuning found no working kernel; using the model's first choice")
            if record is not None:
                return self.for_shape(record, problem)
        if not problem.arch.verified_on_hardware:
            return None  # no tune verified a kernel on this GPU: torch.matmul serves
        return self.first_choice(problem)

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

    def bucket_key(self, problem: GemmProblem) -> str:
        """The results cache's key for `problem` on its GPU."""
        return bucket_key(problem, self.environment(problem.device.index or 0), self.policy)

    def ensure_tuned(self, problem: GemmProblem, **options) -> TunedRecord | None:
        """The record of `problem`'s bucket, tuned and stored first where the cache has none
        (once between the processes sharing the cache); None when nothing ran correctly."""
        if not problem.supported:
            raise ValueError(f"no gemmtune kernel serves this problem: {problem.fallback_reason}")
        return self.results_cache().tune_once(
            self.bucket_key(problem), lambda: self._tuned_record(problem, **options)
        )

    def tune(self, problem: GemmProblem, **options) -> object:
        """Tune `problem` now (whatever the cache holds), store the result for its bucket and
        return the `TuneResult`; `options` go to `tuner.tune` (top_k, exhaustive, ...)."""
        if not problem.supported:
            raise ValueError(f"no gemmtune kernel serves this problem: {problem.fallback_reason}")
        outcome = []
        self.results_cache().tune_once(
            self.bucket_key(problem),
            lambda: self._tuned_record(problem, outcome, **options),
            replace=True,
        )
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
        return tune(problem, **options)

    @staticmethod
    def first_choice(problem: GemmProblem) -> GemmConfig:
        """The ranking model's fastest config, run in bands."""
        from gemmtune.space import candidates
        from gemmtune.space.ranking import RankingModel, in_first_order
        from gemmtune.tuning.tuner import device_model_for

        model = RankingModel(device_model_for(problem))
        return in_first_order(model.top_k(problem, candidates(problem, orders=False), 1)[0])


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
