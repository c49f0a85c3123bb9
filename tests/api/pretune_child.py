"""One rank of a two-process pretune on the CPU: run by `test_pretune.py`, both at once.

argv: rank, world size, the gloo rendezvous file, the shared folder, and optionally "hold": the
rank's cache already holds the first bucket. Each rank has a cache of its own and a fake tuner
whose winner names the rank (tile_n 64 + 8 x rank), so ranks that each tuned a bucket would
disagree, and which takes a moment, as a tune does, so that both ranks claim buckets. It prints,
as JSON, the buckets it tuned and every record its cache ends with."""

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

from gemmtune.api.choice import ConfigChooser
from gemmtune.api.pretune import LinearShape, linear_gemms, pretune_problems
from gemmtune.cache.buckets import Environment
from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem
from gemmtune.tuning.tuner import CandidateResult, TuneResult

rank, world, init_file, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
hold = sys.argv[5:] == ["hold"]
tuned = []


def fake_tune(problem, **options):
    tuned.append(f"{problem.m}x{problem.n}x{problem.k}")
    time.sleep(0.2)
    config = GemmConfig(tile_n=64 + 8 * rank)
    ran = CandidateResult(config, None, 0.1 + rank)
    return TuneResult(problem, config, 0.1 + rank, 1e-3, [ran], 1, 1, 0.0, 0.0, 0.1)


chooser = ConfigChooser(
    results=ResultsCache(folder / f"rank{rank}.sqlite"),
    tuner=fake_tune,
    environment=lambda index: Environment("NVIDIA H200", 132, "0", "0"),
)
shapes = [LinearShape("qkv", 6144, 4096), LinearShape("o", 4096, 4096)]
problems = [
    GemmProblem.of_shape(g.m, g.n, g.k, dtype=g.dtype, layout=g.layout, arch=Arch.SM90)
    for g in linear_gemms(shapes, [1, 16, 64, 256, 1024])
]
if hold:
    held = TunedRecord(config=GemmConfig(tile_n=208).key, ms=0.5, how="held before")
    chooser.results_cache().store(chooser.bucket_key(problems[0]), held)
dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
outcome = pretune_problems(problems, chooser=chooser, progress=False)
dist.destroy_process_group()
records = {key: record.to_json() for key, record in chooser.results_cache().items()}
sources = {row.key: row.source for row in outcome.rows}
print(json.dumps({"tuned": tuned, "records": records, "sources": sources}))
