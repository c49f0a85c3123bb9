"""Our chosen configs beside cuBLAS and QuACK's autotuned GEMM, on the same tensors.

An H200 held at its power cap moves cuBLAS by 3-13 % from card to card, so "at least as fast
as QuACK" is only decided on one card, in one run. This times the configs of `CONFIRMED`,
cuBLAS (`torch.mm`) and QuACK (`quack.gemm_interface.gemm(a, b, tuned=True, split_k=None)`:
its autotuner times all its SM90 configs and split-K on the first call) in alternating
do_bench rounds (`common.do_bench_rounds`) on the same `torch.randn` tensors, each verified
against a float32 reference (output poisoned with NaN) first; then, with `--sustained-reps`,
in loops of a second of back-to-back runs (`sustained_rounds`), which measure what steady use
gets: there a kernel's power per cycle sets its clocks, and do_bench's short windows do not
show it. One do_bench window of a 100-700 µs GEMM moves 2-5 % with the clocks, hence rounds.

QuACK is not a dependency of gemmtune: install it beside it for this suite,
`pip install --no-deps quack-kernels==0.6.5 einops` (0.6.5 runs on nvidia-cutlass-dsl 4.8.1).
Without it the suite times our configs against cuBLAS alone.

    python -m benchmarks peers --out-dir DIR [--shapes a,b] [--dtypes bf16,fp16]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common import (
    DTYPES,
    RESULTS,
    TOLERANCE,
    against_cublas,
    compile_and_load,
    do_bench_rounds,
    kernel_row,
    load_shapes,
    write_results,
)
from gemmtune.core.config import GemmConfig
from gemmtune.kernels.launch import launch_args
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.timing import L2Flusher
from gemmtune.measure.verify import relative_error
from gemmtune.workers.compiler import CompileJob

SUITE_HELP = "chosen configs beside cuBLAS and QuACK (when installed), in rounds and 1 s loops"

# Per shape, the configs the kernel suite picked most often (the best of a sweep of binaries at
# four runtime orders, rm/rn x s1/s8) with the runner-up binary; down_4k keeps its stream-K
# variant.
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
#: the shapes of the speed bar: large GEMMs where every library keeps all SMs busy
BAR_SHAPES = ("sq4096", "sq8192", "l8b_qkv_4k", "l8b_gateup_4k", "l8b_down_4k")


@dataclass(frozen=True)
class Peer:
    """Another library timed beside ours: `make(a, b, out)` prepares it for one problem and
    returns (the function that computes a @ b into `out`, the name of what it chose)."""

    name: str
    version: str
    make: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[Callable[[], None], str]]


def quack_peer() -> Peer | None:
    """QuACK's autotuned GEMM (the baselines' call), or None where QuACK is not installed."""
    try:
        from quack.gemm_interface import gemm, gemm_tuned
    except ImportError:
        return None

    def make(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
        def run() -> None:
            gemm(a, b, out=out, tuned=True, split_k=None)

        run()  # the first call for a shape tunes
        c = gemm_tuned.best_config.kwargs["config"]
        chosen = (
            f"{c.tile_m}x{c.tile_n} c{c.cluster_m}x{c.cluster_n} "
            f"{'pingpong' if c.pingpong else 'cooperative'}{' swap_ab' if c.swap_ab else ''}"
            f"{f' split_k {c.split_k}' if c.split_k > 1 else ''}"
        )
        return run, chosen

    return Peer("quack", importlib.metadata.version("quack-kernels"), make)


def compile_confirmed(dtypes: list[str], shapes: list[str], workers: int) -> dict:
    """The kernels of the shapes' `CONFIRMED` configs for each dtype, keyed by
    (compile key, dtype)."""
    configs = [GemmConfig.from_key(key) for s in shapes for key in CONFIRMED[s]]
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

    def launcher(config: GemmConfig) -> Callable[[], object]:
        kernel = kernels[(config.compile_key, dtype)]
        args = launch_args(config, a.device, m, n, k, 1)
        return lambda: kernel(a, b, out, *args)

    def cublas() -> None:
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


class Nvml:
    """NVML's readings of one GPU: its total-energy counter and its SM clock."""

    def __init__(self, index: int = 0):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def millijoules(self) -> int:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)

    def sm_mhz(self) -> int:
        return self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)


def timed_loop(
    fn: Callable[[], object], flush: Callable[[], None], runs: int, nvml: Nvml
) -> tuple[float, float, float]:
    """(ms, mJ, mean SM clock in MHz) per run of `runs` back-to-back (flush, fn) runs: CUDA
    events around the loop, NVML's energy counter read before and after, its clock sampled
    while the loop runs."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    energy = nvml.millijoules()
    begin.record()
    for _ in range(runs):
        flush()
        fn()
    end.record()
    clocks = []
    while not end.query():
        clocks.append(nvml.sm_mhz())
        time.sleep(0.005)
    torch.cuda.synchronize()
    energy = nvml.millijoules() - energy
    mhz = statistics.fmean(clocks) if clocks else math.nan
    return begin.elapsed_time(end) / runs, energy / runs, mhz


def sustained_rounds(
    fns: list[Callable[[], object]], reps: int, seconds: float = 1.0
) -> list[list[tuple[float, float]]]:
    """Each function's (ms per run, mean SM clock in MHz) over `reps` loops of `seconds` of
    back-to-back runs, L2 cleared before each run (a loop's time over its runs, less the time
    of a clear alone), the functions in turn, every other rep reversed.

    An H200 at its power cap sets its clocks from the power drawn over the last milliseconds,
    so a kernel's throughput in steady use (a serving loop) depends on its power per cycle as
    well as its cycles: do_bench's 100 ms windows start from the clocks the window before left
    (gateup: two kernels of equal cycles read from 2.7 % apart either way in do_bench rounds,
    0.5 % apart, always the same way, in these loops)."""
    nvml, flush = Nvml(torch.cuda.current_device()), L2Flusher()

    def runs_for(fn: Callable[[], object]) -> int:
        """Warm up 0.2 s; the number of runs that fill `seconds`."""
        ms = timed_loop(fn, flush, 10, nvml)[0]
        ms = timed_loop(fn, flush, max(1, int(200 / ms)), nvml)[0]
        return max(10, int(seconds * 1e3 / ms))

    flush_ms = timed_loop(lambda: None, flush, 1000, nvml)[0]
    counts = [runs_for(fn) for fn in fns]
    results: list[list[tuple[float, float]]] = [[] for _ in fns]
    for rep in range(reps):
        order = list(zip(fns, counts, results, strict=True))
        for fn, runs, out in order if rep % 2 == 0 else reversed(order):
            timed_loop(fn, flush, max(1, runs // 10), nvml)  # 10 % of the loop again as warm-up
            ms, _, mhz = timed_loop(fn, flush, runs, nvml)
            out.append((ms - flush_ms, mhz))
    return results


def sustained_fields(sustained: list, ours_at: int, peer_at: dict[str, int]) -> dict:
    """A row's fields from `sustained_rounds` (index 0: cuBLAS): medians over the reps of ms
    per run and mean SM clock, and the ratios."""

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


def time_shape(
    shape: dict,
    dtype: str,
    kernels: dict,
    rounds: int,
    peers: tuple[Peer, ...] = (),
    sustained_reps: int = 0,
) -> list[dict]:
    """One kernel row per confirmed config of `shape`, with cuBLAS's and each peer's timings."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    configs = [GemmConfig.from_key(key) for key in CONFIRMED[shape["name"]]]
    runs, errors, peer_choices = verified_contenders(shape, dtype, kernels, configs, peers)
    times = do_bench_rounds(runs, rounds)
    sustained = sustained_rounds(runs, sustained_reps) if sustained_reps else None
    cublas_ms = statistics.median(times[0])
    first_peer = 1 + len(configs)
    peer_at = {peer.name: first_peer + j for j, peer in enumerate(peers)}
    rows = []
    for i, config in enumerate(configs, start=1):
        ours_ms = statistics.median(times[i])
        per_round = sorted(c / o for c, o in zip(times[0], times[i], strict=True))
        row = {
            **kernel_row(shape["name"], m, n, k, dtype, config.key),
            **against_cublas(m, n, k, ours_ms, cublas_ms),
            "rel_err": round(errors[i], 6),
            "cublas_rel_err": round(errors[0], 6),
            "rounds": rounds,
            "round_ratio_min": round(per_round[0], 4),
            "round_ratio_median": round(statistics.median(per_round), 4),
            "round_ratio_max": round(per_round[-1], 4),
        }
        for peer, choice in zip(peers, peer_choices, strict=True):
            at = peer_at[peer.name]
            peer_ms = statistics.median(times[at])
            row[f"{peer.name}_config"] = choice
            row[f"{peer.name}_rel_err"] = round(errors[at], 6)
            row[f"{peer.name}_ms"] = round(peer_ms, 5)
            row[f"{peer.name}_ratio"] = round(cublas_ms / peer_ms, 4)  # the peer vs cuBLAS
            row[f"vs_{peer.name}"] = round(peer_ms / ours_ms, 4)  # above 1: we are faster
        if sustained is not None:
            row.update(sustained_fields(sustained, i, peer_at))
        rows.append(row)
    return rows


def summary(shape_rows: list[dict], peers: tuple[Peer, ...]) -> str:
    """One line for a shape and dtype: our best config, and where it stands."""
    best = max(shape_rows, key=lambda r: r["ratio"])
    line = f"{best['shape']:>14} {best['dtype']} ours {best['ratio']:.3f} of cuBLAS"
    line += f" ({best['config'][5:]})"
    for peer in peers:
        line += (
            f"; {peer.name} {best[f'{peer.name}_ratio']:.3f} of cuBLAS "
            f"({best[f'{peer.name}_config']}), ours {best[f'vs_{peer.name}']:.3f} of it"
        )
    if "sustained_ratio" in best:
        line += f"; sustained: ours {best['sustained_ratio']:.3f} of cuBLAS"
    return line


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks peers", description=SUITE_HELP)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sustained-reps",
        type=int,
        default=4,
        help="also time each contender in this many 1 s loops (steady use; 0: skip)",
    )
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument(
        "--shapes", default=",".join(BAR_SHAPES), help=f"any of {', '.join(CONFIRMED)}"
    )
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    dtypes, names = args.dtypes.split(","), args.shapes.split(",")
    unknown = sorted(set(names) - set(CONFIRMED))
    if unknown:
        parser.error(f"no confirmed configs for {unknown}")
    quack = quack_peer()
    if quack is None:
        print("QuACK is not installed: timing our configs against cuBLAS alone", flush=True)
    peers = () if quack is None else (quack,)
    kernels = compile_confirmed(dtypes, names, args.workers)
    rows = []
    for shape in load_shapes(args.shapes):
        for dtype in dtypes:
            shape_rows = time_shape(shape, dtype, kernels, args.rounds, peers, args.sustained_reps)
            rows += shape_rows
            print(summary(shape_rows, peers), flush=True)
    contenders = "cuBLAS (torch.mm)" + "".join(
        f", {p.name} {p.version} (tuned on its first call for each shape and dtype)" for p in peers
    )
    method = (
        f"peers.CONFIRMED configs and {contenders} timed with triton.testing.do_bench (warmup "
        f"25 ms, rep 100 ms, L2 cleared each rep, median), in turn {args.rounds} times, every "
        f"other round reversed; *_ms: medians over the rounds; ratio = cublas_ms / ours_ms, "
        f"<peer>_ratio = cublas_ms / <peer>_ms, vs_<peer> = <peer>_ms / ours_ms; round_ratio_*: "
        f"the per-round ratios' spread; inputs torch.randn, A (m,k) and B (k,n) row-major, same "
        f"tensors for every contender, each verified against a float32 reference (rel. "
        f"Frobenius error < {TOLERANCE}) first"
    )
    if args.sustained_reps:
        method += (
            f"; sustained_*: each contender in {args.sustained_reps} loops of 1 s of "
            f"back-to-back runs (L2 cleared before each run, the clear's time taken off), in "
            f"turn, every other rep reversed; *_sustained_ms: median ms per run over the "
            f"loops, *_mhz: the mean SM clock NVML read during them; sustained_ratio = "
            f"cublas_sustained_ms / sustained_ms, vs_<peer>_sustained = <peer>_sustained_ms / "
            f"sustained_ms"
        )
    return write_results("peers", method, rows, args.out_dir)


if __name__ == "__main__":
    print(main())
