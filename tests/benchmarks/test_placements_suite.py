"""The placements suite on a CPU: its default problem and configs, and the spread it reports."""

import torch
from benchmarks.placements import DEFAULT_CONFIGS, DEFAULT_SHAPE, spread_by_config

from gemmtune.core.config import GemmConfig
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem
from gemmtune.space import refusal


def test_the_default_configs_serve_the_default_problem():
    m, n, k = (int(x) for x in DEFAULT_SHAPE.split("x"))
    problem = GemmProblem.of_shape(
        m, n, k, dtype=torch.float8_e4m3fn, out_dtype=torch.bfloat16, layout="tt",
        device="cuda:0", arch=Arch.SM90,
    )  # fmt: skip
    for key in DEFAULT_CONFIGS.split(","):
        assert refusal(GemmConfig.from_key(key), problem) is None, key


def test_the_spread_is_each_contenders_slowest_placement_over_its_fastest():
    rows = [
        {"config": "a", "ours_ms": 0.0336, "cublas_ms": 0.0334},
        {"config": "b", "ours_ms": 0.0332, "cublas_ms": 0.0334},
        {"config": "a", "ours_ms": 0.0356, "cublas_ms": 0.0335},
        {"config": "b", "ours_ms": 0.0333, "cublas_ms": 0.0335},
    ]
    spread = spread_by_config(rows)
    assert spread["a"] == 0.0356 / 0.0336
    assert spread["b"] == 0.0333 / 0.0332
    assert spread["torch"] == 0.0335 / 0.0334
