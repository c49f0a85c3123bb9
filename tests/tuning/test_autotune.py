"""@autotune's logic on the CPU: keys, pruning, selection, failures and both caches, with a
fake benchmark standing in for the GPU."""

import pytest
import torch

from gemmtune.cache.results import ResultsCache
from gemmtune.measure.runner import Measurement
from gemmtune.tuning.autotune import Autotuner, autotune, describe, import_path

CONFIGS = [{"block": 64}, {"block": 128}, {"block": 256}]


class FakeBenchmark:
    """Times: block 128 fastest; a config listed in `fail` comes back failed."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], fail

    def __call__(self, configs, args, kwargs):
        self.calls.append([c["block"] for c in configs])
        return [
            Measurement(repr(c), None, error="wrong result: rel err 0.5")
            if c["block"] in self.fail
            else Measurement(repr(c), abs(c["block"] - 128) / 100 + 1.0)
            for c in configs
        ]


def scaled(x, factor, *, config):
    return x * factor + config["block"]


def make(tmp_path, fail=(), **options):
    bench = FakeBenchmark(fail)
    tuner = Autotuner(
        scaled,
        CONFIGS,
        key=options.pop("key", ["x"]),
        results=ResultsCache(tmp_path / "r.sqlite"),
        benchmark=bench,
        **options,
    )
    return tuner, bench


def test_tunes_once_per_key_then_calls_at_the_winner(tmp_path):
    tuner, bench = make(tmp_path)
    x = torch.ones(4)
    assert tuner(x, 2.0).tolist() == [130.0] * 4  # block 128 won
    assert tuner(x, 3.0).tolist() == [131.0] * 4  # same key (x's shape): no new tuning
    assert len(bench.calls) == 1 and tuner.tunings == 1
    tuner(torch.ones(8), 2.0)  # a new shape is a new key
    assert len(bench.calls) == 2
    # a caller's own config bypasses tuning
    assert tuner(torch.ones(2), 1.0, config={"block": 1}).tolist() == [2.0, 2.0]
    assert len(bench.calls) == 2


def test_a_second_process_finds_the_result_in_the_cache(tmp_path):
    first, _ = make(tmp_path)
    first(torch.ones(4), 2.0)
    second, bench = make(tmp_path)  # fresh memory, same results file
    assert second(torch.ones(4), 2.0).tolist() == [130.0] * 4
    assert bench.calls == [] and second.tunings == 0
    # a cached winner that is no longer among the configs is stale: tune again
    third = Autotuner(
        scaled, CONFIGS[:1], key=["x"], results=second.results, benchmark=FakeBenchmark()
    )
    assert third(torch.ones(4), 2.0).tolist() == [66.0] * 4 and third.tunings == 1


def test_failing_configs_are_never_chosen(tmp_path):
    tuner, _ = make(tmp_path, fail=(128,))
    assert tuner(torch.ones(4), 2.0).tolist() == [66.0] * 4  # 64 beats 256 once 128 is out
    everything, _ = make(tmp_path / "all", fail=(64, 128, 256))
    with pytest.raises(RuntimeError, match=r"no config of .* ran correctly"):
        everything(torch.ones(4), 2.0)


def test_prune_and_key_functions(tmp_path):
    def small_blocks(configs, arguments):
        assert arguments["factor"] == 2.0  # the call's arguments, by name
        return [c for c in configs if c["block"] <= 128 and arguments["x"].numel() >= 4]

    tuner, bench = make(tmp_path, prune=small_blocks, key=lambda x, factor: x.numel() // 4)
    tuner(torch.ones(4), 2.0)
    tuner(torch.ones(5), 2.0)  # 5 // 4 == 4 // 4: same key
    assert bench.calls == [[64, 128]]
    with pytest.raises(ValueError, match="prune left no config"):
        tuner(torch.ones(1), 2.0)


def test_keys_describe_tensors_by_shape_strides_and_dtype(tmp_path):
    tuner, _ = make(tmp_path)
    t = torch.ones(4, 6).t()
    assert describe(t) == "(6, 4)/(1, 6)/float32"
    assert tuner.key_of((t, 2.0), {}) == "x=(6, 4)/(1, 6)/float32"
    bad, _ = make(tmp_path, key=["y"])
    with pytest.raises(TypeError, match="key names"):
        bad(torch.ones(2), 1.0)


def test_only_importable_functions_are_isolated_in_a_worker():
    def nested(x, *, config):
        return x

    assert import_path(scaled) == f"{__name__}:scaled"
    assert import_path(nested) is None and import_path(lambda x: x) is None


def test_the_decorator_keeps_the_function_and_its_name():
    @autotune(configs=CONFIGS, key=["x"])
    def double(x, *, config):
        """Twice x."""
        return 2 * x

    assert isinstance(double, Autotuner) and double.__doc__ == "Twice x."
    assert double(torch.ones(2), config=CONFIGS[0]).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="at least one config"):
        autotune(configs=[], key=["x"])(scaled)


def test_the_output_argument_is_found_by_position_or_by_name(tmp_path):
    def write(x, out, *, config):
        out.copy_(x)

    tuner = Autotuner(write, CONFIGS, key=["x"], output="out", benchmark=FakeBenchmark())
    x = torch.ones(2)
    assert tuner.output_location((x, x), {}) == 1
    assert tuner.output_location((x,), {"out": x}) == "out"
    with pytest.raises(TypeError, match="does not pass"):
        tuner.output_location((x,), {})


def test_functions_of_a_script_without_a_main_guard_are_timed_in_process(tmp_path, monkeypatch):
    import sys
    import types

    for source, isolated in [("x = 1\n", False), ('if __name__ == "__main__":\n    x = 1\n', True)]:
        script = tmp_path / "script.py"
        script.write_text(source)
        main = types.ModuleType("__main__")
        main.__file__ = str(script)
        monkeypatch.setitem(sys.modules, "__main__", main)

        def user_kernel(x, *, config):
            return x

        user_kernel.__module__, user_kernel.__qualname__ = "__main__", "user_kernel"
        assert (import_path(user_kernel) is not None) is isolated


def test_the_worker_starts_at_decoration_when_the_function_will_tune(tmp_path, monkeypatch):
    from gemmtune import workers

    started = []

    class Worker:
        def start(self):
            started.append(True)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(workers, "bench_worker", lambda device, import_main: Worker())
    results = ResultsCache(tmp_path / "r.sqlite")
    Autotuner(scaled, CONFIGS, key=["x"], results=results)
    assert started == [True]  # nothing of it in the cache: its first call will tune
    Autotuner(scaled, CONFIGS, key=["x"], results=results, isolate=False)
    assert started == [True]  # timed in this process: no worker
    results.store(f"autotune|{__name__}.scaled|x=(4,)", record_of_block(128))
    Autotuner(scaled, CONFIGS, key=["x"], results=results)
    assert started == [True]  # tuned before: the cache will answer


def record_of_block(block):
    from gemmtune.cache.results import TunedRecord

    return TunedRecord(repr({"block": block}), 1.0)
