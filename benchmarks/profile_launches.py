"""Launch cuBLAS and named configs of ours on one problem, a few times each, for a profiler.

Nsight Compute's counters say where two kernels of one problem differ (the bytes each moves
from DRAM and L2, the throughputs); this program hands it exactly those launches. Every config
is compiled and checked against the float32 product first (output poisoned with NaN), outside
the NVTX range `profile` that the launches to read run in, so `--nvtx-include profile/` leaves
the checks and the compilation out. A GPU tool, not a suite (it writes no results file):

    ncu --clock-control none --cache-control all --nvtx --nvtx-include profile/ \\
        --section SpeedOfLight \\
        --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum \\
        python -m benchmarks.profile_launches 512x512x32768 sm90_128x64_c1x2_coop_tma_sk4_rm_s1

The L2 request coalescer's counters
(`lrc__request_sectors_op_read_coalescing_achieved_type_hardware.sum`,
`lrc__lrc2xbar_sectors_op_read.sum`: identical reads merged in flight, and the sectors read
from L2 after merging) and `sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active`
are the ones `docs/kernels.md` compares on the small-MN split-K problems.
"""

from __future__ import annotations

import argparse
import sys

import torch

from gemmtune.cli.main import parse_shape as cli_shape
from gemmtune.core.config import GemmConfig
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels.build import compile_gemm
from gemmtune.kernels.launch import launch
from gemmtune.kernels.signature import KernelSignature
from gemmtune.measure.verify import check, poison

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_shape(text: str) -> tuple[int, int, int]:
    """`MxNxK` (argparse type): `gemmtune`'s shape syntax, without a batch."""
    m, n, k, l = cli_shape(text)
    if l is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: profile an MxNxK problem, unbatched")
    return m, n, k


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_launches", description=__doc__.splitlines()[0]
    )
    parser.add_argument("shape", type=parse_shape, help="MxNxK")
    parser.add_argument("configs", help="comma-separated config keys (GemmConfig.key)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument(
        "--layout", choices=("nk", "kn"), default="nk", help="nk: x @ w.t(), kn: x @ w"
    )
    parser.add_argument("--repeats", type=int, default=2, help="launches of each, in turn")
    args = parser.parse_args(argv)
    m, n, k = args.shape
    dtype = DTYPES[args.dtype]
    generator = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=generator)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=generator)
    b = w.t() if args.layout == "nk" else w.t().contiguous()
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    reference = x.float() @ b.float()
    signature = KernelSignature.of(GemmProblem.from_tensors(x, b))
    kernels = []
    for key in args.configs.split(","):
        config = GemmConfig.from_key(key)
        kernel = compile_gemm(config, signature)
        poison(out)
        launch(kernel, x, b, out, config)
        ok, err = check(out, reference)
        print(f"{key}: relative error {err:.2e}{'' if ok else ' (WRONG)'}", flush=True)
        if not ok:
            return 1
        kernels.append((kernel, config))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for _ in range(args.repeats):
        torch.mm(x, b, out=out)
        for kernel, config in kernels:
            launch(kernel, x, b, out, config)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
