"""What the caches cost and save.

1. First call with warm caches: a process tunes a problem (filling both caches in a fresh
   cache folder); a fresh process then imports gemmtune and makes the first `tuned_gemm` call
   for that bucket: its wall time (until the result is ready) and whether anything compiled.
2. Cache hit overhead: host time of `tuned_gemm(a, b, out=out)` against launching the same
   compiled kernel directly, median of 1000 calls each, small problem.
3. Bucketing: for shapes inside one power-of-two bucket, the bucket's winner (tuned on the
   bucket's first shape) against the winner of an exact tune of each shape, side by side.

    python -m benchmarks cache --out-dir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import RESULTS, write_results

SUITE_HELP = "what the kernel and results caches cost and save: first calls, hits, buckets"

FIRST_CALL = """
import cProfile, io, json, pstats, sys, time
t0 = time.perf_counter()
import torch, gemmtune
from gemmtune.api.dispatch import DISPATCHER, tuned_gemm
a = torch.randn({m}, {k}, device="cuda", dtype=torch.bfloat16)
b = torch.randn({k}, {n}, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
profile = cProfile.Profile() if {profile} else None
t1 = time.perf_counter()
if profile:
    profile.enable()
out = tuned_gemm(a, b, mode="{mode}")
torch.cuda.synchronize()
t2 = time.perf_counter()
if profile:
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
    print(text.getvalue(), file=sys.stderr)
caches = list(DISPATCHER.kernel_caches.values())
compiles, loads = sum(c.compiles for c in caches), sum(c.loads for c in caches)
print(json.dumps({{"import_and_setup_s": t1 - t0, "first_call_ms": (t2 - t1) * 1e3,
                  "compiles": compiles, "loads": loads, "dsl_imported": "cutlass" in sys.modules}}))
"""


def in_fresh_process(code: str, cache: Path, profile_to: Path | None = None) -> dict:
    """Run `code` in a new Python process on the cache folder `cache`: the JSON it prints
    last; with `profile_to`, its standard error (the profile) is written there."""
    env = dict(os.environ, GEMMTUNE_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    if profile_to is not None:
        profile_to.write_text(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def host_us(fn: Callable[[], object], calls: int = 1000) -> float:
    """The median host time of one call of `fn`, in µs (the GPU drained every 200 calls, so
    that the launch queue never fills)."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e3)
        if i % 200 == 199:
            torch.cuda.synchronize()
    return statistics.median(times)


def bucketing(folder: Path) -> list[dict]:
    """Inside one bucket: the bucket's winner, the bucket's choice for the shape (its measured
    configs re-ranked for that shape, what tuned_gemm serves) and an exact tune's winner, side
    by side."""
    from gemmtune.api.choice import ConfigChooser, record_of
    from gemmtune.core.config import CUBLAS
    from gemmtune.core.problem import GemmProblem
    from gemmtune.tuning.tuner import tune

    def problem(m: int, n: int, k: int) -> GemmProblem:
        a = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        return GemmProblem.from_tensors(a, torch.empty(k, n, device="cuda", dtype=torch.bfloat16))

    record = record_of(tune(problem(4096, 4096, 4096), kernel_dir=folder, progress=False))
    bucket = record.gemm_config
    rows = []
    for m, n, k in ((2560, 4096, 4096), (3072, 3072, 4096), (4096, 2304, 3072), (3504, 3512, 3496)):
        p = problem(m, n, k)
        chosen = ConfigChooser.for_shape(record, p)
        exact = tune(p, kernel_dir=folder, progress=False).best
        contenders = list(dict.fromkeys(c for c in (bucket, chosen, exact) if c is not None))
        both = tune(
            p, configs=contenders, sweep=0, finalists=len(contenders), kernel_dir=folder,
            progress=False,
        )  # fmt: skip
        final = {r.config: r.final_ms or r.ms for r in both.results}
        rows.append(
            {
                "what": "bucketing",
                "shape": "custom",
                "m": m,
                "n": n,
                "k": k,
                "bucket": "m4096_n4096_k4096",
                "bucket_config": bucket.key,
                "chosen_config": chosen.key if chosen else CUBLAS,
                "exact_config": exact.key,
                "bucket_ms": round(final[bucket], 5),
                "chosen_ms": round(final[chosen], 5) if chosen else None,
                "exact_ms": round(final[exact], 5),
                "bucket_vs_exact": round(final[exact] / final[bucket], 4),
                "chosen_vs_exact": round(final[exact] / final[chosen], 4) if chosen else None,
            }
        )
        print(
            f"bucketing {m}x{n}x{k}: of the exact winner's speed, the bucket's winner reaches "
            f"{rows[-1]['bucket_vs_exact']:.3f}, the bucket's choice for the shape "
            f"{rows[-1]['chosen_vs_exact']}"
        )
    return rows


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks cache", description=SUITE_HELP)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)  # the first call's profile goes there
    rows = []
    m, n, k = 4096, 4096, 4096
    with tempfile.TemporaryDirectory(prefix="gemmtune-cache-") as folder:
        cache = Path(folder)
        tuned = in_fresh_process(FIRST_CALL.format(m=m, n=n, k=k, mode="tune", profile=0), cache)
        warm = in_fresh_process(FIRST_CALL.format(m=m, n=n, k=k, mode="tune", profile=0), cache)
        in_fresh_process(
            FIRST_CALL.format(m=m, n=n, k=k, mode="tune", profile=1),
            cache,
            profile_to=args.out_dir / "first-call-profile.txt",
        )
        rows.append(
            {
                "what": "first_call_cold_caches",
                "ms": round(tuned["first_call_ms"], 1),
                "compiles": tuned["compiles"],
            }
        )
        rows.append(
            {
                "what": "first_call_warm_cache",
                "ms": round(warm["first_call_ms"], 2),
                "compiles": warm["compiles"],
                "loads": warm["loads"],
                "dsl_imported": warm["dsl_imported"],
                "import_and_setup_s": round(warm["import_and_setup_s"], 2),
                "runs": 1,
            }
        )
        print(
            f"first call, cold caches {tuned['first_call_ms'] / 1e3:.1f} s; "
            f"warm {warm['first_call_ms']:.1f} ms, {warm['compiles']} compiles"
        )

        os.environ["GEMMTUNE_CACHE_DIR"] = str(cache)
        from gemmtune.api.dispatch import plan, tuned_gemm

        a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
        cached = plan(a, b, out=out, mode="heuristic")
        if cached.launcher is None:
            raise SystemExit(f"no kernel of ours serves 256^3 here: {cached.reason}")
        direct = host_us(lambda: cached.launcher(a, b, out, *cached.args))
        hit = host_us(lambda: tuned_gemm(a, b, out=out, mode="heuristic"))
        rows.append({"what": "launch_direct", "us": round(direct, 2), "runs": 1000})
        rows.append(
            {
                "what": "cache_hit",
                "us": round(hit, 2),
                "runs": 1000,
                "overhead_us": round(hit - direct, 2),
            }
        )
        print(f"direct launch {direct:.2f} us, tuned_gemm hit {hit:.2f} us: +{hit - direct:.2f} us")
        rows += bucketing(cache / "bucketing")

    method = (
        "first calls: wall time of the first tuned_gemm in a fresh process (GEMMTUNE_CACHE_DIR "
        "filled by a previous process), until the result is ready; overheads: host time per "
        "call (perf_counter_ns), median of 1000 after 100 warm-up calls, 256x256x256 bf16"
    )
    return write_results("cache", method, rows, args.out_dir)


if __name__ == "__main__":
    print(main())
