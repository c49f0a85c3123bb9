"""`@autotune`: tuning for users' own kernel wrappers, in the spirit of `triton.autotune`.

    @gemmtune.autotune(configs=[...], key=["m", "n", "k"], reference=torch_version)
    def my_gemm(a, b, c, m, n, k, *, config): ...

The first call for a key value times the function at every config (after `prune`), with the
benchmark `tune` uses: each config's output checked against `reference` first (a wrong or
failing config is never chosen), CUDA events after warm-up, cold L2, median. It runs in a
separate worker process when the function can be imported there by name (a module-level function
of an importable module, or of a script with an `if __name__ == "__main__":` guard), so a config
that faults on the GPU costs the worker, not the caller; else in this process. The winner is
kept in memory and in the results cache that `tuned_gemm` uses (SQLite, keyed by the function,
the key's values, the GPU and the versions), so the next process does not tune again. Compiled
kernels are the wrapper's to keep (a dictionary from config to compiled kernel, say).
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.measure.callable_runner import CallableJob, CallableRunner, CallableSpec, to_cpu
from gemmtune.measure.runner import Measurement

log = logging.getLogger(__name__)

CALLABLE_RUNNER = "gemmtune.measure.callable_runner:CallableRunner"
Benchmark = Callable[[list[Any], tuple, dict], list[Measurement]]


def describe(value: Any) -> str:
    """A key value as text: tensors by shape, strides and dtype; anything else by repr."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}/{tuple(value.stride())}/{str(value.dtype).split('.')[-1]}"
    return repr(value)


def import_path(fn: Callable) -> str | None:
    """ "module:qualname" when a fresh process can find `fn` by importing, else None."""
    qualname = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not module or "<" in qualname:  # lambdas and functions defined inside functions
        return None
    if module == "__main__" and not _guarded_script(
        getattr(sys.modules["__main__"], "__file__", None)
    ):
        # an interactive session cannot be imported; a script without the guard would run its
        # top level again in the worker (and tune again there, and again ...)
        return None
    return f"{module}:{qualname}"


def _guarded_script(path: str | None) -> bool:
    """True when `path` is a script with an `if __name__ == "__main__":` guard."""
    try:
        source = Path(path).read_text() if path else ""
    except OSError:
        return False
    return re.search(r"""if\s+__name__\s*==\s*['"]__main__['"]""", source) is not None


class Autotuner:
    """A function with a config argument, called at the best config for its key."""

    def __init__(
        self,
        fn: Callable,
        configs: Sequence[Any],
        key: Sequence[str] | Callable[..., Any],
        *,
        prune: Callable[[list[Any], dict[str, Any]], list[Any]] | None = None,
        reference: Callable | None = None,
        output: int | str | None = None,
        config_arg: str = "config",
        isolate: bool = True,
        warmup_ms: float = 10.0,
        runs: int = 30,
        run_timeout_s: float = 300.0,
        results: ResultsCache | None = None,
        cache: bool = True,
        benchmark: Benchmark | None = None,
    ):
        if not configs:
            raise ValueError("autotune needs at least one config")
        self.fn = fn
        self.configs = list(configs)
        self.key = key
        self.prune = prune
        self.reference = reference
        self.output = output
        self.config_arg = config_arg
        self.isolate = isolate
        self.warmup_ms, self.runs, self.run_timeout_s = warmup_ms, runs, run_timeout_s
        self._results = results
        self.cache = cache
        self.benchmark = benchmark or self._benchmark
        self.signature = inspect.signature(fn)
        self.name = f"{fn.__module__}.{fn.__qualname__}"
        self.best: dict[str, Any] = {}
        self.tunings = 0
        self.last_measurements: list[Measurement] = []
        #: seconds from the start of the last benchmark to each of its steps
        self.last_timeline: dict[str, float] = {}
        functools.update_wrapper(self, fn)
        self._start_worker_early()

    def _start_worker_early(self) -> None:
        """Start the benchmark worker now, while the program goes on towards its first call,
        where that call will tune in a worker: a GPU is there, the function can be imported
        by a worker, and the results cache holds nothing of it. The worker's start (torch's
        import and a CUDA context) is most of a first tuning's cost."""
        from gemmtune import _in_helper_process

        paths = [import_path(self.fn), import_path(self.reference) if self.reference else ""]
        if not (self.isolate and self.cache and torch.cuda.is_available()):
            return
        if _in_helper_process() or None in paths:
            return
        if self.results.holds_prefix(f"autotune|{self.name}|"):
            return
        from gemmtune import workers

        device = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        in_main = any(p.startswith("__main__:") for p in paths if p)
        workers.bench_worker(device, import_main=in_main).start()

    # -- keys ------------------------------------------------------------------------------

    def arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        bound = self.signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def key_of(self, args: tuple, kwargs: dict) -> str:
        """The text that decides whether a call needs its own tuning."""
        if callable(self.key):
            values = self.key(*args, **kwargs)
            values = values if isinstance(values, tuple) else (values,)
            return ",".join(map(describe, values))
        named = self.arguments(args, kwargs)
        missing = [name for name in self.key if name not in named]
        if missing:
            raise TypeError(f"autotune key names {missing}, which {self.name} was not given")
        return ",".join(f"{name}={describe(named[name])}" for name in self.key)

    def _cache_key(self, key: str, args: tuple, kwargs: dict) -> str:
        return f"autotune|{self.name}|{key}|{_environment(args, kwargs)}"

    def output_location(self, args: tuple, kwargs: dict) -> int | str | None:
        """Where this call's `output` argument is: its position among `args`, or its name
        among `kwargs`."""
        if not isinstance(self.output, str) or self.output in kwargs:
            return self.output
        names = list(self.signature.parameters)
        if self.output in names and names.index(self.output) < len(args):
            return names.index(self.output)
        raise TypeError(f"autotune output names {self.output!r}, which this call does not pass")

    # -- calling ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.config_arg in kwargs:  # the caller chose
            return self.fn(*args, **kwargs)
        key = self.key_of(args, kwargs)
        config = self.best.get(key, _MISSING)
        if config is _MISSING:
            config = self._choose(key, args, kwargs)
            self.best[key] = config
        return self.fn(*args, **kwargs, **{self.config_arg: config})

    def _choose(self, key: str, args: tuple, kwargs: dict) -> Any:
        """The config for `key`: the results cache's, else tuned here (once per key across the
        processes that share the cache: `ResultsCache.tune_once`)."""
        if not self.cache:
            return self._tune(args, kwargs, key)[0]
        tuned: list[Any] = []

        def tune_record() -> TunedRecord:
            best, record = self._tune(args, kwargs, key)
            tuned.append(best)
            return record

        cache_key = self._cache_key(key, args, kwargs)
        record = self.results.tune_once(cache_key, tune_record)
        by_name = {repr(c): c for c in self.configs}
        if record.config not in by_name:  # a record of configs no longer listed is stale
            record = self.results.tune_once(cache_key, tune_record, replace=True)
        return tuned[0] if tuned else by_name[record.config]

    @property
    def results(self) -> ResultsCache:
        if self._results is None:
            self._results = ResultsCache()
        return self._results

    # -- tuning ----------------------------------------------------------------------------

    def candidates(self, args: tuple, kwargs: dict) -> list[Any]:
        configs = self.configs
        if self.prune is not None:
            configs = list(self.prune(list(configs), self.arguments(args, kwargs)))
            if not configs:
                raise ValueError(f"autotune prune left no config for {self.name}")
        return configs

    def tune(self, args: tuple, kwargs: dict, key: str | None = None) -> Any:
        """Time every candidate config on these arguments now; store and return the best."""
        key = key or self.key_of(args, kwargs)
        best, record = self._tune(args, kwargs, key)
        if self.cache:
            self.results.store(self._cache_key(key, args, kwargs), record)
        return best

    def _tune(self, args: tuple, kwargs: dict, key: str) -> tuple[Any, TunedRecord]:
        """Time every candidate config: the best, and the record the cache keeps of it."""
        configs = self.candidates(args, kwargs)
        self.tunings += 1
        measured = self.benchmark(configs, args, kwargs)
        self.last_measurements = measured
        timed = sorted(
            ((m.ms, i) for i, m in enumerate(measured) if m.ms is not None and m.error is None)
        )
        for m in measured:
            if m.error:
                log.info("%s at %s failed: %s", self.name, m.config_key, m.error)
        if not timed:
            errors = "; ".join(f"{m.config_key}: {m.error}" for m in measured)
            raise RuntimeError(f"no config of {self.name} ran correctly ({errors})")
        best = configs[timed[0][1]]
        log.info("%s [%s]: %r in %.4f ms", self.name, key, best, timed[0][0])
        record = TunedRecord(
            config=repr(best),
            ms=timed[0][0],
            runners_up=tuple((repr(configs[i]), ms) for ms, i in timed[1:]),
            how=f"autotune: {len(timed)} of {len(configs)} configs ran correctly",
        )
        return best, record

    def _benchmark(self, configs: list[Any], args: tuple, kwargs: dict) -> list[Measurement]:
        """Each config verified, then timed: in a worker process when one can import the
        function (and the reference), else here."""
        device = _device_of(args, kwargs)
        output = self.output_location(args, kwargs)
        spec = CallableSpec(
            self.fn, args, kwargs, self.config_arg, self.reference, output, device.index or 0
        )
        paths = (import_path(self.fn), import_path(self.reference) if self.reference else "")
        jobs = [CallableJob(c, self.warmup_ms, self.runs) for c in configs]
        bar = tqdm(jobs, desc=f"gemmtune autotune {self.fn.__name__}", unit="cfg", leave=False)
        start = time.perf_counter()
        self.last_timeline = {}

        def mark(step: str) -> None:
            self.last_timeline[step] = round(time.perf_counter() - start, 3)

        if self.isolate and all(p is not None for p in paths):
            from gemmtune import workers

            spec.function, spec.reference = paths[0], paths[1] or None
            spec.args, spec.kwargs = to_cpu(args), to_cpu(kwargs)
            in_main = any(p.startswith("__main__:") for p in paths if p)
            worker = workers.bench_worker(device.index or 0, import_main=in_main)
            with worker.lease(run_timeout_s=self.run_timeout_s):
                worker.wait_ready()
                mark("worker_ready")
                worker.setup(CALLABLE_RUNNER, spec)
                mark("set_up")
                measured = [worker.measure(job, repr(job.config)) for job in bar]
                mark("measured")
                return measured
        if self.isolate:
            log.warning(
                "%s cannot be imported by a worker process (a lambda, a nested function or an "
                "interactive session): its configs are timed in this process, where a faulting "
                "one can break the CUDA context",
                self.name,
            )
        spec.on_device = True
        runner = CallableRunner(spec)
        return [_guarded(runner, job) for job in bar]


def _guarded(runner: CallableRunner, job: CallableJob) -> Measurement:
    try:
        return runner.measure(job)
    except Exception as exc:  # the config's failure, reported like the worker reports it
        return Measurement(repr(job.config), None, error=f"{type(exc).__name__}: {exc}")


_MISSING = object()


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    devices = {t.device for t in _tensors(args, kwargs) if t.is_cuda}
    if len(devices) != 1:
        raise ValueError("autotune times functions whose tensor arguments are on one CUDA GPU")
    return devices.pop()


def _environment(args: tuple, kwargs: dict) -> str:
    from gemmtune.cache.buckets import current_environment

    cuda = [t for t in _tensors(args, kwargs) if t.is_cuda]
    if not cuda:
        return "no gpu"
    return current_environment(cuda[0].device.index or 0).key


def autotune(
    configs: Sequence[Any],
    key: Sequence[str] | Callable[..., Any],
    *,
    prune: Callable[[list[Any], dict[str, Any]], list[Any]] | None = None,
    reference: Callable | None = None,
    output: int | str | None = None,
    config_arg: str = "config",
    isolate: bool = True,
    warmup_ms: float = 10.0,
    runs: int = 30,
    cache: bool = True,
) -> Callable[[Callable], Autotuner]:
    """Tune the decorated function over `configs` for each value of `key`.

    `key`: argument names (tensors count by shape, strides and dtype) or a function of the
    call's arguments. `prune(configs, arguments)` drops configs that cannot serve a call.
    `reference(*args, **kwargs)` computes the right answer (returning it, or writing it into
    the argument `output` names); each config's result (its return value, or `output`) must
    match it. The config is passed as the keyword `config_arg`; configs must have a stable
    repr (they are cached by it) and, for the worker process, pickle.
    """

    def wrap(fn: Callable) -> Autotuner:
        return Autotuner(
            fn,
            configs,
            key,
            prune=prune,
            reference=reference,
            output=output,
            config_arg=config_arg,
            isolate=isolate,
            warmup_ms=warmup_ms,
            runs=runs,
            cache=cache,
        )

    return wrap
