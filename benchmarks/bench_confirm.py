"""Chosen configs against cuBLAS over many do_bench rounds: the check of a speed bar.

`bench_kernel.py` picks each shape's config from one round of finalists, and one `do_bench`
window of a 100-700 µs GEMM on an H200 at its power cap moves by 2-5 % with the clocks (run 6
of kernel-h200: single rounds of sq4096 between 0.92 and 1.12 of cuBLAS). This times the
configs `bench_kernel.py` picked most often for each shape (`CONFIRMED`) and cuBLAS
(`torch.mm`) the same way, in `--rounds` alternating rounds (`common.do_bench_rounds`), and
reports each config's median against cuBLAS's median and the spread of the per-round ratios.
Same `torch.randn` tensors for every contender, each verified against a float32 reference
(output poisoned with NaN first) before it is timed.

    python benchmarks/bench_confirm.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    DTYPES,
    RESULTS,
    TOLERANCE,
    against_cublas,
    compile_and_load,
    do_bench_rounds,
    kernel_row,
    load_shapes,
    sustained_rounds,
    write_results,
)

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.launch import launch_args
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.verify import relative_error
from gemmtune.workers.compiler import CompileJob

# The bar shapes of issue 3: the best of a sweep of 5-6 binaries per shape at four runtime
# rasters (rm/rn x s1/s8) beside QuACK on one H200 (session 12, bf16, 6 rounds), each with
# the runner-up binary; down_4k keeps its stream-K variant. The others: picks of kernel-h200
# runs 5-8 for issue 4's shapes.
CONFIRMED = {
    "sq4096": (
        "sm90_128x256_c2x1_coop_tma_dp_rn_s8",
        "sm90_256x128_c1x2_swap_coop_tma_dp_rm_s8",
    ),
    "sq8192": (
        "sm90_256x208_c1x2_swap_coop_tma_dp_rm_s8",
        "sm90_256x192_c1x2_coop_tma_dp_rm_s8",
    ),
    "l8b_qkv_4k": (
        "sm90_256x192_c1x2_coop_tma_dp_rm_s8",
        "sm90_256x192_c2x1_coop_tma_dp_rm_s1",
    ),
    "l8b_gateup_4k": (
        "sm90_256x208_c1x2_swap_coop_tma_dp_rn_s1",
        "sm90_256x208_c1x2_swap_coop_tma_dp_rm_s8",
    ),
    "l8b_down_4k": (
        "sm90_128x256_c2x1_coop_tma_dp_rn_s8",
        "sm90_256x128_c1x2_swap_coop_tma_dp_rm_s8",
        "sm90_128x256_c2x1_coop_tma_streamk_rn_s8",
    ),
    "wave_1k_4352": ("sm90_256x144_c1x1_coop_tma_dp_rn_s1", "sm90_256x144_c2x1_coop_tma_dp_rm_s1"),
    "wave_2k_2304": ("sm90_192x192_c1x2_coop_tma_dp_rm_s4", "sm90_192x192_c1x2_coop_tma_dp_rn_s2"),
    "smallmn_512_32k": ("sm90_128x128_c2x1_coop_tma_sk8_rm_s2",),
    "smallmn_256_1k_64k": ("sm90_128x128_c2x1_coop_tma_sk8_rm_s8",),
}


def compile_configs(configs: list[GemmConfig], dtypes: list[str], workers: int) -> dict:
    """The kernels of `configs` for each dtype, keyed by (compile key, dtype)."""
    # one binary per compile key: the runtime fields (raster, swizzle) are launch arguments
    binaries = {config.compile_key: config for config in configs}.values()
    jobs = [
        CompileJob(config, KernelSignature(ab_dtype=d, out_dtype=d))
        for config in sorted(binaries, key=lambda c: c.key)
        for d in dtypes
    ]
    kernels, failed = compile_and_load(jobs, workers)
    if failed:
        raise RuntimeError(f"compile failed: {failed[0].job.name}: {failed[0].error}")
    return kernels


def compile_confirmed(dtypes: list[str], shapes: list[str], workers: int) -> dict:
    configs = [GemmConfig.from_key(key) for s in shapes for key in CONFIRMED[s]]
    return compile_configs(configs, dtypes, workers)


@dataclass(frozen=True)
class Peer:
    """Another library timed beside ours: `make(a, b, out)` prepares it for one problem and
    returns (the function that computes a @ b into `out`, the name of what it chose)."""

    name: str
    make: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[Callable[[], None], str]]


def verified_contenders(
    shape: dict, dtype: str, kernels: dict, configs: list[GemmConfig], peers: tuple[Peer, ...]
) -> tuple[list[Callable[[], object]], list[float], list[str]]:
    """cuBLAS, `configs` and `peers` on one shape's `torch.randn` tensors (the same for all),
    each run once into a NaN-poisoned output and checked against a float32 reference: their
    run functions in that order, their relative errors, and what each peer chose."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=DTYPES[dtype])
    b = torch.randn(k, n, device="cuda", dtype=DTYPES[dtype])
    out = torch.empty(m, n, device="cuda", dtype=DTYPES[dtype])
    ref = torch.matmul(a.float(), b.float())

    def launcher(config: GemmConfig):
        kernel = kernels[(config.compile_key, dtype)]
        args = launch_args(config, a.device, m, n, k, 1)
        return lambda: kernel(a, b, out, *args)

    def cublas():
        torch.mm(a, b, out=out)

    peer_outs = [torch.empty_like(out) for _ in peers]
    peer_runs, peer_choices = [], []
    for peer, peer_out in zip(peers, peer_outs, strict=True):
        run, choice = peer.make(a, b, peer_out)
        peer_runs.append(run)
        peer_choices.append(choice)
    runs = [cublas] + [launcher(c) for c in configs] + peer_runs
    outs = [out] * (1 + len(configs)) + peer_outs
    errors = []
    for run, written in zip(runs, outs, strict=True):
        written.fill_(float("nan"))
        run()
        errors.append(relative_error(written, ref))
        if errors[-1] > TOLERANCE:
            raise RuntimeError(f"{shape['name']} {dtype}: relative error {errors[-1]:.3g}")
    return runs, errors, peer_choices


def confirm_shape(
    shape: dict,
    dtype: str,
    kernels: dict,
    rounds: int,
    peers: tuple[Peer, ...] = (),
    sustained_reps: int = 0,
) -> list[dict]:
    m, n, k = shape["m"], shape["n"], shape["k"]
    configs = [GemmConfig.from_key(key) for key in CONFIRMED[shape["name"]]]
    runs, errors, peer_choices = verified_contenders(shape, dtype, kernels, configs, peers)
    times = do_bench_rounds(runs, rounds)
    sustained = sustained_rounds(runs, sustained_reps) if sustained_reps else None
    cublas_ms = statistics.median(times[0])
    ours_times = times[1 : 1 + len(configs)]
    peer_times = times[1 + len(configs) :]
    peer_at = {peer.name: 1 + len(configs) + j for j, peer in enumerate(peers)}
    rows = []
    ours_rows = zip(configs, ours_times, errors[1 : 1 + len(configs)], strict=True)
    for i, (config, ours, err) in enumerate(ours_rows):
        ours_ms = statistics.median(ours)
        per_round = sorted(c / o for c, o in zip(times[0], ours, strict=True))
        row = {
            **kernel_row(shape["name"], m, n, k, dtype, config.key),
            **against_cublas(m, n, k, ours_ms, cublas_ms),
            "rel_err": round(err, 6),
            "cublas_rel_err": round(errors[0], 6),
            "rounds": rounds,
            "round_ratio_min": round(per_round[0], 4),
            "round_ratio_median": round(statistics.median(per_round), 4),
            "round_ratio_max": round(per_round[-1], 4),
        }
        peer_errors = errors[1 + len(configs) :]
        for peer, choice, peer_t, peer_err in zip(
            peers, peer_choices, peer_times, peer_errors, strict=True
        ):
            peer_ms = statistics.median(peer_t)
            row[f"{peer.name}_config"] = choice
            row[f"{peer.name}_rel_err"] = round(peer_err, 6)
            row[f"{peer.name}_ms"] = round(peer_ms, 5)
            row[f"{peer.name}_ratio"] = round(cublas_ms / peer_ms, 4)  # the peer vs cuBLAS
            row[f"vs_{peer.name}"] = round(peer_ms / ours_ms, 4)  # above 1: we are faster
        if sustained is not None:
            row.update(sustained_fields(sustained, 1 + i, peer_at))
        rows.append(row)
    return rows


def sustained_fields(sustained: list, ours_at: int, peer_at: dict[str, int]) -> dict:
    """A row's fields from `common.sustained_rounds` (index 0: cuBLAS): medians over the
    reps of ms per run and mean SM clock, and the ratios."""

    def median(at: int, field: int) -> float:
        return statistics.median(rep[field] for rep in sustained[at])

    ours_ms, cublas_ms = median(ours_at, 0), median(0, 0)
    fields = {
        "sustained_ms": round(ours_ms, 5),
        "sustained_mhz": round(median(ours_at, 1)),
        "cublas_sustained_ms": round(cublas_ms, 5),
        "cublas_sustained_mhz": round(median(0, 1)),
        "sustained_ratio": round(cublas_ms / ours_ms, 4),
    }
    for name, at in peer_at.items():
        fields[f"{name}_sustained_ms"] = round(median(at, 0), 5)
        fields[f"{name}_sustained_mhz"] = round(median(at, 1))
        fields[f"vs_{name}_sustained"] = round(median(at, 0) / ours_ms, 4)
    return fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--shapes", default=",".join(CONFIRMED))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    dtypes, names = args.dtypes.split(","), args.shapes.split(",")
    unknown = set(names) - set(CONFIRMED)
    if unknown:
        parser.error(f"no confirmed configs for {sorted(unknown)}")
    kernels = compile_confirmed(dtypes, names, args.workers)
    rows = []
    for shape in [s for s in load_shapes() if s["name"] in names]:
        for dtype in dtypes:
            for row in confirm_shape(shape, dtype, kernels, args.rounds):
                rows.append(row)
                print(
                    f"{row['shape']:>20} {dtype} {row['config'][5:]:<34} ratio {row['ratio']:.3f}"
                    f" (rounds {row['round_ratio_min']:.3f}..{row['round_ratio_max']:.3f})",
                    flush=True,
                )
    method = (
        f"fixed configs (bench_confirm.CONFIRMED) and cuBLAS (torch.mm) timed with "
        f"triton.testing.do_bench (warmup 25 ms, rep 100 ms, L2 cleared each rep, median), in "
        f"turn {args.rounds} times, every other round reversed; ours_ms and cublas_ms: medians "
        f"over the rounds, ratio = cublas_ms / ours_ms; round_ratio_*: the per-round ratios' "
        f"spread; inputs torch.randn, A (m,k) and B (k,n) row-major, output row-major, same "
        f"tensors for every contender, each verified against a float32 reference (rel. "
        f"Frobenius error < {TOLERANCE}) first"
    )
    print(f"wrote {write_results('confirm', method, rows, args.out_dir)}")


if __name__ == "__main__":
    main()
