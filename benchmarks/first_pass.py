"""How far the tuner's first pass is from its final: the evidence behind `FINAL_MARGIN`.

Per problem, a tune of a fixed set of configs (`tune(configs=...)`, binaries from the kernel
cache), every one of them sent to the final: each config's first-pass time (verified, a short
warm-up, median of 10 runs, cold L2) beside its final time (alone in windows taken in turn
with the others and torch.matmul), on the same `torch.randn` operands. A config whose
first-pass time is further behind the leader's than `FINAL_MARGIN`, or behind `FINALISTS`
others, never reaches a normal tune's final: `reaches_final` says whether each one would.

    python -m benchmarks first-pass --out-dir DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import RESULTS, write_results
from gemmtune.core.config import GemmConfig
from gemmtune.core.problem import GemmProblem
from gemmtune.tuning.tuner import FINAL_MARGIN, FINALISTS, tune

SUITE_HELP = "the tuner's first-pass times against its final's, per config (FINAL_MARGIN)"

E4M3 = torch.float8_e4m3fn
FP8 = dict(dtype=E4M3, layout="tt", out_dtype=torch.bfloat16, scaling="tensor")
BF16_ROW_MAJOR = dict(dtype=torch.bfloat16, layout="tn")


def _keys(*families: str) -> list[str]:
    return [f"sm90_{family}_tma_dp_rm_s1" for family in families]


#: (name, dtype name, sizes and operand kinds, configs): the leaders of the ranking and of
#: the public suite's runs on each problem
CASES = (
    (
        "sq4096",
        "e4m3",
        dict(m=4096, n=4096, k=4096, **FP8),
        _keys(
            "128x176_c1x1_pp",
            "128x176_c1x2_pp",
            "256x176_c1x1_coop",
            "256x128_c1x2_coop",
            "256x128_c1x1_coop",
            "128x256_c1x1_coop",
            "128x192_c1x1_pp",
            "128x256_c2x1_coop",
        ),
    ),
    (
        "sq2048",
        "e4m3",
        dict(m=2048, n=2048, k=2048, **FP8),
        _keys(
            "256x144_c4x1_coop",
            "128x144_c4x1_pp",
            "128x256_c1x1_coop",
            "256x128_c1x1_coop",
            "128x128_c2x1_pp",
            "128x128_c1x2_pp",
            "192x176_c1x2_coop",
        ),
    ),
    (
        "l8b_qkv_128",
        "e4m3",
        dict(m=128, n=6144, k=4096, **FP8),
        _keys(
            "64x112_c2x2_pp",
            "64x128_c4x1_swap_pp",
            "128x48_c1x1_pp",
            "64x96_c1x2_pp",
            "64x96_c2x1_pp",
            "128x64_c1x4_pp",
        ),
    ),
    (
        "sq4096",
        "bf16",
        dict(m=4096, n=4096, k=4096, **BF16_ROW_MAJOR),
        _keys(
            "128x256_c1x1_coop",
            "256x176_c1x1_coop",
            "256x176_c1x1_swap_coop",
            "256x128_c1x1_coop",
            "256x128_c1x2_coop",
            "128x176_c1x2_pp",
        ),
    ),
)


def reaches_final(first_ms: dict[str, float]) -> set[str]:
    """The configs a normal tune sends to its final, given every config's first-pass time."""
    ranked = sorted(first_ms, key=first_ms.__getitem__)
    best = first_ms[ranked[0]]
    return {key for key in ranked[:FINALISTS] if first_ms[key] <= best * (1 + FINAL_MARGIN)}


def case_rows(name: str, dtype: str, sizes: dict, keys: list[str]) -> list[dict]:
    problem = GemmProblem.of_shape(**sizes)
    configs = [GemmConfig.from_key(key) for key in keys]
    result = tune(
        problem,
        configs=configs,
        finalists=len(configs),
        final_margin=float("inf"),
        sweep=0,
        cublas=True,
        progress=False,
    )
    timed = [r for r in result.results if r.ok and r.final_ms is not None]
    finalists = reaches_final({r.config.key: r.ms for r in timed})
    fastest = min(timed, key=lambda r: r.final_ms)
    return [
        {
            "shape": name,
            "m": problem.m,
            "n": problem.n,
            "k": problem.k,
            "l": 1,
            "dtype": dtype,
            "layout": sizes["layout"],
            "config": r.config.key,
            "first_pass_ms": r.ms,
            "final_ms": r.final_ms,
            "first_over_final": round(r.ms / r.final_ms, 4),
            "final_over_fastest": round(r.final_ms / fastest.final_ms, 4),
            "reaches_final": r.config.key in finalists,
            "cublas_final_ms": result.cublas_ms,
        }
        for r in sorted(timed, key=lambda r: r.final_ms)
    ]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks first-pass", description=SUITE_HELP)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    for case in CASES:
        for row in case_rows(*case):
            print(
                f"{row['dtype']:>5} {row['shape']:>12} {row['config']:45s} first "
                f"{row['first_pass_ms'] * 1e3:8.1f} us final {row['final_ms'] * 1e3:8.1f} us "
                f"({row['final_over_fastest']:.3f} of the fastest)"
                + ("  finalist" if row["reaches_final"] else ""),
                flush=True,
            )
            rows.append(row)
    method = (
        "per problem one tune of the listed configs (binaries from the kernel cache, sweep off), "
        "every config in the final: first pass = verified, 10 ms warm-up (150 ms after an idle "
        "GPU), median of 10 runs; final = each alone in windows of 30 ms taken in turn 3 times "
        "with torch.matmul; CUDA events, L2 emptied by a 2x-L2 read before every run, "
        f"torch.randn operands; reaches_final: FINALISTS={FINALISTS} within "
        f"FINAL_MARGIN={FINAL_MARGIN} of the best first pass"
    )
    return write_results("tuning", method, rows, args.out_dir, name="first-pass")
