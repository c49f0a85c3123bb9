"""A tiny CuTe DSL kernel, `y = alpha * x + y`, that proves the toolchain end to end.

`gemmtune doctor --compile` and the compile-only tests build it for sm_90a and sm_100a on
machines without a GPU; the GPU tests run it on torch tensors. It shares nothing with the GEMM
kernels on purpose: when it fails, the toolchain is at fault, not our GEMM code.

Like every module that defines kernels it imports `cutlass` at the top (the DSL evaluates the
annotations of kernel functions, so they cannot be strings), and must be imported only after
`CUTE_DSL_ARCH` is settled. Run as `CUTE_DSL_ARCH=sm_90a python -m gemmtune.kernels.smoke` to
compile it for that target in a fresh process.
"""

import json
import os
import tempfile
import time
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 128


@cute.kernel
def _axpy_kernel(x: cute.Tensor, y: cute.Tensor, alpha: cutlass.Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < cute.size(x):
        y[i] = alpha * x[i] + y[i]


@cute.jit
def _axpy(x: cute.Tensor, y: cute.Tensor, alpha: cutlass.Float32, stream: cuda.CUstream):
    # `stream` is torch's current stream, bound by TVM-FFI at call time (see compile_axpy)
    blocks = (cute.size(x) + THREADS - 1) // THREADS
    _axpy_kernel(x, y, alpha).launch(grid=[blocks, 1, 1], block=[THREADS, 1, 1], stream=stream)


def compile_axpy(keep_ptx: bool = False) -> Any:
    """Compile the kernel for any length of fp32 vectors, for the DSL's current target.

    It is compiled for TVM-FFI, the launch path of every gemmtune kernel: the result is called
    with torch tensors and a Python float, on torch's current stream. With `keep_ptx` the PTX is
    kept on the result (`.artifacts.PTX`); the DSL also writes it to a dump directory, so that
    goes to a temporary one.
    """
    n = cute.sym_int64(symbol="n")
    x = make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16)
    y = make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    with tempfile.TemporaryDirectory() as dump:
        options = "--enable-tvm-ffi" + (f" --keep-ptx --dump-dir {dump}" if keep_ptx else "")
        return cute.compile(_axpy, x, y, cutlass.Float32(1.0), stream, options=options)


def main() -> None:
    """Compile for `CUTE_DSL_ARCH` and print a JSON line with the target and the time taken."""
    start = time.perf_counter()
    compiled = compile_axpy(keep_ptx=True)
    ptx = compiled.artifacts.PTX or ""
    targets = [line.split()[1] for line in ptx.splitlines() if line.startswith(".target")]
    report = {
        "target": os.environ.get("CUTE_DSL_ARCH", "(device)"),
        "ptx_target": targets[0] if targets else None,
        "compile_s": round(time.perf_counter() - start, 3),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
