"""@gemmtune.autotune around a user's own CuTe DSL kernel: a scaled vector add, out = alpha*x + y.

The wrapper takes a config (threads per block, elements per thread) and keeps its compiled
kernels in a dictionary; @autotune times every config on the first call for each size (checked
against the torch reference first), caches the winner in gemmtune's results cache, and calls
the wrapper at the winner from then on.

Run on a GPU machine:  python examples/custom_kernel_decorator.py
"""

import time

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

import gemmtune

CONFIGS = [
    {"threads": threads, "per_thread": per_thread}
    for threads in (128, 256, 512)
    for per_thread in (1, 2, 4, 8)
]


@cute.kernel
def axpy_kernel(
    x: cute.Tensor,
    y: cute.Tensor,
    out: cute.Tensor,
    alpha: cutlass.Float32,
    n: cutlass.Int32,
    per_thread: cutlass.Constexpr,
):
    thread, _, _ = cute.arch.thread_idx()
    block, _, _ = cute.arch.block_idx()
    threads, _, _ = cute.arch.block_dim()
    first = block * threads * per_thread + thread
    for j in cutlass.range_constexpr(per_thread):
        i = first + j * threads  # neighbouring threads touch neighbouring elements
        if i < n:
            value = alpha * x[i].to(cutlass.Float32) + y[i].to(cutlass.Float32)
            out[i] = value.to(out.element_type)


@cute.jit
def axpy_launch(
    x: cute.Tensor,
    y: cute.Tensor,
    out: cute.Tensor,
    alpha: cutlass.Float32,
    n: cutlass.Int32,
    threads: cutlass.Constexpr,
    per_thread: cutlass.Constexpr,
):
    per_block = threads * per_thread
    axpy_kernel(x, y, out, alpha, n, per_thread).launch(
        grid=((n + per_block - 1) // per_block, 1, 1), block=(threads, 1, 1)
    )


COMPILED = {}  # (threads, per_thread, dtype) -> compiled kernel: the wrapper's own cache


def tensor(t: torch.Tensor):
    return from_dlpack(t, assumed_align=16).mark_layout_dynamic()


def reference(x, y, out, alpha):
    out.copy_(alpha * x.float() + y.float())


@gemmtune.autotune(configs=CONFIGS, key=["x"], reference=reference, output="out")
def axpy(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, alpha: float, *, config):
    key = (config["threads"], config["per_thread"], x.dtype)
    if key not in COMPILED:
        COMPILED[key] = cute.compile(
            axpy_launch, tensor(x), tensor(y), tensor(out), alpha, x.numel(), *key[:2]
        )
    COMPILED[key](tensor(x), tensor(y), tensor(out), alpha, x.numel())


def main() -> None:
    x = torch.randn(1 << 24, device="cuda", dtype=torch.bfloat16)
    y = torch.randn_like(x)
    out = torch.empty_like(x)
    start = time.perf_counter()
    axpy(x, y, out, 0.5)  # tunes: every config, checked, then timed
    print(f"first call (tuning {len(CONFIGS)} configs): {time.perf_counter() - start:.1f} s")
    best = axpy.best[axpy.key_of((x, y, out, 0.5), {})]
    print(f"best config for {x.numel()} elements: {best}")
    start = time.perf_counter()
    axpy(x, y, out, 0.5)  # the winner, straight away
    torch.cuda.synchronize()
    print(f"second call: {1e3 * (time.perf_counter() - start):.2f} ms, tunings: {axpy.tunings}")
    torch.testing.assert_close(out.float(), 0.5 * x.float() + y.float(), atol=1e-2, rtol=1e-2)
    print("result matches torch")


if __name__ == "__main__":
    main()
