"""Placements: whether a config's time depends on where in memory its operands lie.

One problem, several allocations of its operands in one process (each a `GemmRunner` of its own
with its own seed, after a gap of an odd number of MiB), and at each allocation the given
configs and torch's product (`torch.matmul`, `torch._scaled_mm`, `torch._int_mm`) timed as the
tuner's final times them: each alone in windows taken in turn, the L2 emptied by a read before
every run, the launch hold, median. A config whose time moves from one allocation to the next
while torch's does not is one that a tune timed at a single allocation may pick by luck; this is
why the tuner times memory-bound problems on several placements (`docs/tuning.md`).

Rows are kernel rows with `placement` (0, 1, ...) and `b_address` (the weight's address, hex);
`ratio` is torch's time at that placement over the config's.

    python -m benchmarks placements --shape 16x10240x8192 --dtype e4m3 \\
        --configs sm90_128x32_c2x1_swap_coop_tma_k256_dp_rm_s8,... [--placements 5]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import RESULTS, against_cublas, kernel_row, write_results

SUITE_HELP = (
    "given configs of one problem and torch's product timed on several allocations of the "
    "operands in one process: how much each one's time depends on where the operands lie"
)

#: the H100 case of `docs/tuning.md`: the 70B qkv projection at 16 rows, fp8 per tensor
DEFAULT_SHAPE = "16x10240x8192"
DEFAULT_CONFIGS = (
    "sm90_128x32_c2x1_swap_coop_tma_k256_dp_rm_s8,sm90_128x32_c4x1_swap_coop_tma_k256_dp_rm_s8,"
    "sm90_64x16_c4x1_swap_pp_tma_k256_dp_rm_s8,sm90_128x32_c1x1_swap_coop_tma_k256_dp_rm_s8"
)


def spread_by_config(rows: list[dict]) -> dict[str, float]:
    """Each contender's slowest time over its fastest across the placements (1.0: none), the
    config's rows by `config` and torch's under "torch"."""
    times: dict[str, list[float]] = {}
    for row in rows:
        times.setdefault(row["config"], []).append(row["ours_ms"])
        times.setdefault("torch", []).append(row["cublas_ms"])
    return {key: max(ts) / min(ts) for key, ts in times.items()}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks placements", description=SUITE_HELP)
    parser.add_argument("--shape", default=DEFAULT_SHAPE, metavar="MxNxK")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "e4m3", "int8"), default="e4m3")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, metavar="KEY[,KEY...]")
    parser.add_argument(
        "--accumulation",
        choices=("fast", "promoted"),
        default="fast",
        help="fp8: the tensor cores' own sums, or promoted to fp32 every 128 elements of K",
    )
    parser.add_argument("--placements", type=int, default=5)
    parser.add_argument("--window-ms", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    import torch

    from gemmtune.cache.kernels import KernelCache
    from gemmtune.core.config import CUBLAS, GemmConfig
    from gemmtune.core.dtypes import torch_dtype
    from gemmtune.core.problem import GemmProblem
    from gemmtune.kernels.signature import KernelSignature
    from gemmtune.measure.runner import CompareJob, GemmRunner, ProblemSpec
    from gemmtune.space import refusal

    m, n, k = (int(x) for x in args.shape.split("x"))
    # the output of default_out_dtype: int32 for int8, bf16 for fp8
    promoted = args.dtype == "e4m3" and args.accumulation == "promoted"
    problem = GemmProblem.of_shape(
        m, n, k, dtype=torch_dtype(args.dtype), layout="tt", promoted=promoted
    )
    signature = KernelSignature.of(problem)
    configs = [GemmConfig.from_key(key) for key in args.configs.split(",")]
    for config in configs:
        if (reason := refusal(config, problem)) is not None:
            raise SystemExit(f"{config.key} cannot serve {args.shape}: {reason}")
    kernels = KernelCache(problem.arch.compile_target)
    for config in configs:
        kernels.get(config, signature)  # compiled once, before any timing
    job = CompareJob(
        (*(c.to_json() for c in configs), CUBLAS),
        (*(str(kernels.path(c, signature)) for c in configs), CUBLAS),
        window_ms=args.window_ms,
        rounds=args.rounds,
    )
    runners, gaps = [], []
    for placement in range(args.placements):
        spec = ProblemSpec(m, n, k, 1, signature, problem.device.index or 0, seed=placement)
        runners.append(GemmRunner(spec))
        gaps.append(torch.empty((2 * placement + 7) << 20, dtype=torch.uint8, device="cuda"))
    rows = []
    for placement, runner in enumerate(runners):
        *ours, torch_time = runner.compare(job)
        for config, measured in zip(configs, ours, strict=True):
            row = kernel_row("custom", m, n, k, args.dtype, config.key)
            row.update(layout="tt", placement=placement, b_address=hex(runner.b.data_ptr()))
            row.update(against_cublas(m, n, k, measured.ms, torch_time.ms))
            rows.append(row)
            print(f"placement {placement} {config.key:48s} {measured.ms * 1e3:8.2f} us "
                  f"torch {torch_time.ms * 1e3:8.2f} us", flush=True)  # fmt: skip
    for key, spread in spread_by_config(rows).items():
        print(f"{key:48s} slowest placement {100 * (spread - 1):5.1f} % above the fastest")
    method = (
        f"{args.shape} {args.dtype}{' promoted' if promoted else ''} (A and B K-major, "
        f"torch.randn), {args.placements} "
        "allocations of the operands in one process (a GemmRunner each, seeds 0..., a gap of an "
        "odd number of MiB after each), at each the configs and torch's product timed by "
        f"GemmRunner.compare: windows of ~{args.window_ms:g} ms taken in turn {args.rounds} "
        "times, the L2 emptied by a read before every run, the launch hold, CUDA events, median"
    )
    # one file per problem: several problems run into one folder keep each one's rows
    name = f"placements-{args.shape}-{args.dtype}{'-promoted' if promoted else ''}"
    return write_results("placements", method, rows, args.out_dir, name=name)
