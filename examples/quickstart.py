"""Tune and use: tuned_gemm picks, times and caches the best kernel for a problem's size bucket.

Run on an H100/H200:  python examples/quickstart.py
"""

import logging
import time

import torch

import gemmtune
from gemmtune.api.dispatch import DISPATCHER

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

start = time.perf_counter()
c = gemmtune.tuned_gemm(a, b)  # first call for this bucket: tunes (progress bar), then caches
torch.cuda.synchronize()
print(f"first call: {time.perf_counter() - start:.1f} s (tuning, or a cache hit from a past run)")

start = time.perf_counter()
c = gemmtune.tuned_gemm(a, b)  # the cached winner: a dictionary lookup and a launch
torch.cuda.synchronize()
print(f"second call: {1e3 * (time.perf_counter() - start):.2f} ms")

plan = next(p for p in DISPATCHER.plans.values() if p is not None)
print("served by:", plan.config.key if plan.config else "torch.matmul (it won the tuning)")
error = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
print(f"relative error against float32: {error:.2e}")

# batched, other layouts and dtypes work the same way; what our kernels do not serve (fp32
# inputs here) goes to torch.matmul, and the reason is logged once
x = torch.randn(8, 512, 1024, device="cuda", dtype=torch.float16)
w = torch.randn(2048, 1024, device="cuda", dtype=torch.float16).t()  # a K-major view
print("batched:", tuple(gemmtune.tuned_gemm(x, w.expand(8, -1, -1), mode="heuristic").shape))
print("fp32 (falls back):", tuple(gemmtune.tuned_gemm(a.float(), b.float()).shape))
