"""Choosing the config for a problem: the results cache's record of its bucket, a tune where
the cache has none, or the ranking model's first choice, as the mode says.

A bucket's record keeps every config its tune timed. A shape of the bucket other than the one
tuned is *checked* in mode "tune" (`GEMMTUNE_SHAPE_CHECK`, on by default): the bucket's
`SHAPE_CHECK_CONFIGS` configs predicted fastest on that shape (each measured time scaled by the
ranking model's ratio between the two shapes) are verified and timed on it, beside
torch.matmul, as a tune's final times its finalists; the outcome is stored under the shape's
own key (`shape_key`). Tile fit and wave quantization change within a bucket by more than the
model sees: one kernel had won its bucket by 1.18x on 800 x 1200 x 4096 and ran another shape
of it, 640 x 1800 x 3000, at 0.85 of cuBLAS. A check costs 0.8-1.8 s on an H200 (its binaries
are compiled already), once per shape and cache. Where no check runs (mode "cache-only" on a
shape never checked, or checks off), the choice is re-made from the record alone: the scaled
times, a runner-up replacing the winner only when clearly faster (`SWITCH_MARGIN`).
Tuning also times torch.matmul (cuBLAS) beside the finalists, and a bucket or shape where our
best kernel does not beat it by `tuner.CUBLAS_MARGIN` is served by torch.matmul.
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
SHAPE_CHECK_ENV = "GEMMTUNE_SHAPE_CHECK"
# how much faster, scaled to a shape, a bucket's runner-up must be than its winner to replace it:
# the runners-up were not all timed in the final, and the model's ratios are rough
SWITCH_MARGIN = 1.05
#: How many of a bucket's timed configs a shape check times on the shape (with torch.matmul):
#: those its scaled times rank first. Their binaries are compiled; each costs a verification,
#: a timing and a place in the final.
SHAPE_CHECK_CONFIGS = 3
#: What begins the results-cache key of one checked shape (`shape_key`), so that it never
#: meets a bucket's key: a bucket of powers of two is named like a shape.
SHAPE_KEY_PREFIX = "shape_"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def cublas_candidate() -> bool:
    """Whether tuning times torch.matmul beside our kernels (default yes; GEMMTUNE_CUBLAS=0
    to tune our kernels only)."""
    return _env_flag(CUBLAS_ENV)


def shape_checks() -> bool:
    """Whether mode "tune" checks a shape of a tuned bucket other than the one tuned (default
    yes; GEMMTUNE_SHAPE_CHECK=0 to choose from the bucket's record alone)."""
    return _env_flag(SHAPE_CHECK_ENV)


def scaled_times(record: TunedRecord, problem: GemmProblem) -> list[tuple[str, float]]:
    """The record's measured (config key, ms), each scaled to `problem`'s shape by the ranking
    model's predicted ratio between it and the tuned shape (torch.matmul's by the ratio of the
    rooflines), in the record's order."""
    from gemmtune.space.ranking import RankingModel
    from gemmtune.tuning.tuner import device_model_for

    measured = [(record.config, record.ms), *record.runners_up]
    model = RankingModel(device_model_for(problem))
    m, n, k, l = record.shape
    tuned = dataclasses.replace(problem, m=m, n=n, k=k, l=l)

    def scaled(name: str, ms: float) -> float:
        if name == CUBLAS:
            return ms * model.roofline_us(problem) / model.roofline_us(tuned)
        config = GemmConfig.from_key(name)
        return ms * model.predict_us(problem, config) / model.predict_us(tuned, config)

    return [(name, scaled(name, ms)) for name, ms in measured]


def shape_contenders(record: TunedRecord, problem: GemmProblem) -> list[GemmConfig]:
    """What a check of `problem`'s shape times (torch.matmul aside): the record's
    `SHAPE_CHECK_CONFIGS` configs of our kernels with the best scaled times."""
    ranked = sorted(scaled_times(record, problem), key=lambda entry: entry[1])
    names = list(dict.fromkeys(name for name, _ in ranked if name != CUBLAS))
    return [GemmConfig.from_key(name) for name in names[:SHAPE_CHECK_CONFIGS]]


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
                checked = self.checked_record(problem, record, check=mode == "tune")
                return self.for_shape(checked or record, problem)
        if not problem.arch.verified_on_hardware:
            return None  # no tune verified a kernel on this GPU: torch.matmul serves
        return self.first_choice(problem)

    @staticmethod
    def for_shape(record: TunedRecord, problem: GemmProblem) -> GemmConfig | None:
        """The choice of a bucket's (or a checked shape's) record for this problem's own
        shape, from the record alone (see the module's docstring)."""
        choice = record.config
        if needs_rechoice(record, problem):
            scaled = scaled_times(record, problem)
            fastest = min(scaled, key=lambda entry: entry[1])
            # another config must win by more than the noise in the measured times
            if fastest[1] * SWITCH_MARGIN < scaled[0][1]:
                choice = fastest[0]
        return None if choice == CUBLAS else GemmConfig.from_key(choice)

    def checked_record(
        self, problem: GemmProblem, record: TunedRecord, *, check: bool
    ) -> TunedRecord | None:
        """The record of `problem`'s own shape checked against its bucket's `record`: the one
        the cache holds, unless the bucket was tuned again since; else, with `check` (and
        `shape_checks()`), one checked now and stored. None where the record alone decides:
        the tuned shape itself, nothing to choose between, a stale check not redone."""
        if not needs_rechoice(record, problem):
            return None
        results = self.results_cache()
        key = self.shape_key(problem)
        held = results.lookup(key)
        if held is not None and held.bucket_tuned_at == record.tuned_at:
            return held
        if not (check and shape_checks()):
            return None
        return results.tune_once(
            key, lambda: self._shape_record(problem, record), replace=held is not None
        )

    def _shape_record(self, problem: GemmProblem, record: TunedRecord) -> TunedRecord | None:
        """Time the bucket's best configs for this shape on it (`shape_contenders`), with
        torch.matmul where tuning includes it: the record of the winner, or None when none of
        them ran correctly here."""
        contenders = shape_contenders(record, problem)
        result = (self.tuner or self._default_tuner)(problem, configs=contenders)
        if result.best is None and result.backend != CUBLAS:
            log.warning(
                "no config of bucket %s ran correctly on %dx%dx%d",
                record.shape, problem.m, problem.n, problem.k,
            )  # fmt: skip
            return None
        checked = record_of(result)
        p = problem
        log.info(
            "checked %dx%dx%dx%d (bucket tuned on %s): %s wins (%.4f ms)",
            *(p.m, p.n, p.k, p.l), "x".join(map(str, record.shape)), checked.config, checked.ms,
        )  # fmt: skip
        how = f"checked on its shape, bucket tuned on {'x'.join(map(str, record.shape))}: "
        return dataclasses.replace(checked, how=how + checked.how, bucket_tuned_at=record.tuned_at)

    def bucket_key(self, problem: GemmProblem) -> str:
        """The results cache's key for `problem` on its GPU."""
        return bucket_key(problem, self.environment(problem.device.index or 0), self.policy)

    def shape_key(self, problem: GemmProblem) -> str:
        """The results cache's key for `problem`'s own shape on its GPU: its bucket key at the
        exact sizes, prefixed `SHAPE_KEY_PREFIX`."""
        environment = self.environment(problem.device.index or 0)
        return SHAPE_KEY_PREFIX + bucket_key(problem, environment, BucketPolicy("exact"))

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
        """The ranking model's fastest config, in the order the tuner would first time it."""
        from gemmtune.space import candidates
        from gemmtune.space.ranking import RankingModel
        from gemmtune.tuning.tuner import device_model_for

        model = RankingModel(device_model_for(problem))
        return model.first_order(
            problem, model.top_k(problem, candidates(problem, orders=False), 1)[0]
        )


def needs_rechoice(record: TunedRecord, problem: GemmProblem) -> bool:
    """Whether `record` was tuned on another shape than `problem`'s and holds more than one
    measured choice (a record without a shape or a time, stored by hand, decides alone)."""
    shape = (problem.m, problem.n, problem.k, problem.l)
    return record.shape not in (shape, (0, 0, 0, 0)) and (
        record.ms is not None and bool(record.runners_up)
    )


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
