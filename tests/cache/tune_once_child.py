"""A process that needs one bucket tuned: run by `test_tune_once.py`, several at once.

argv: the shared cache folder, how long its tune takes (seconds). Each tune appends this
process's pid to `tunes.log` and picks a config at random, so processes that each tuned would
disagree; it prints the config it ends up with."""

import os
import random
import sys
import time
from pathlib import Path

from gemmtune.api.choice import ConfigChooser
from gemmtune.cache.buckets import Environment
from gemmtune.cache.results import ResultsCache
from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem
from gemmtune.tuning.tuner import CandidateResult, TuneResult

folder, tune_s = Path(sys.argv[1]), float(sys.argv[2])


def slow_tune(problem, **options):
    with open(folder / "tunes.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    time.sleep(tune_s)
    config = GemmConfig(tile_n=random.Random(os.getpid()).choice(range(64, 257, 8)))
    ran = CandidateResult(config, None, 1.0)
    return TuneResult(problem, config, 1.0, 1e-3, [ran], 1, 1, 0.0, 0.0, tune_s)


chooser = ConfigChooser(
    results=ResultsCache(folder / "results.sqlite"),
    tuner=slow_tune,
    environment=lambda index: Environment("NVIDIA H200", 132, "0", "0"),
)
problem = GemmProblem.of_shape(4096, 4096, 4096, arch=Arch.SM90)
print("CONFIG", chooser.config_for(problem, "tune").key, flush=True)
