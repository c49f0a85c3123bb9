"""From a `GemmConfig` and a `KernelSignature` to a compiled kernel callable on torch tensors.

Kernels are compiled for TVM-FFI against *fake* tensors whose sizes and strides are symbolic,
so one binary serves every M, N, K and L; the compiled function takes torch tensors and plain
Python numbers and launches on torch's current stream. Strides other than the unit one are
declared divisible by 8 elements (16 bytes) and the base pointers 16-byte aligned: TMA's rules,
which `GemmProblem` checks before a problem reaches a kernel (and TVM-FFI checks again). An
output that breaks them (`KernelSignature.out_aligned` false) is declared aligned to its element
only, and only kernels with direct stores are built for it.

Like every module that touches the DSL, this one imports `cutlass` lazily or at the top of a
module that only the kernel side imports, after `CUTE_DSL_ARCH` is settled.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemmtune.core import dtypes
from gemmtune.core.config import GemmConfig, Raster
from gemmtune.kernels.signature import KernelSignature

log = logging.getLogger(__name__)


EXPORTED_FUNCTION = "gemm"


@dataclass
class CompiledGemm:
    """A compiled kernel and what it was compiled for.

    Called as `kernel(a, b, out, workspace, counters, *runtime_args(config, device))`: torch
    tensors in torch's order, the split-K/stream-K workspace (`Workspace`), then the runtime
    arguments (raster, swizzle, splits, grid limit) of any config that shares this binary. A
    scaled (fp8) signature's kernel takes its two scales after `out` (`launch.kernel_scales`),
    and a signature with a bias its bias after those.
    `signature` is the problem's: a `swap_ab` binary computes the transposed product, but it is
    called with the problem's own tensors and reads them transposed (`operands.kernel_operands`),
    so `launcher`, what callers invoke, is the compiled function itself.
    """

    config: GemmConfig
    signature: KernelSignature
    function: Any
    compile_s: float
    ptx: str | None = None
    sass: str | None = None
    launcher: Callable = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.launcher = self.function

    def __call__(self, a, b, out, *args) -> None:
        self.launcher(a, b, out, *args)


def runtime_args(config: GemmConfig, device_index: int) -> tuple[int, int, int, int]:
    """The kernel arguments `config` adds to a launch: raster, swizzle, splits, grid limit."""
    from gemmtune.core.device import max_active_clusters

    along_n = int(config.raster is Raster.ALONG_N)
    clusters = max_active_clusters(config.cluster_m * config.cluster_n, device_index)
    return along_n, config.swizzle, config.splits, clusters


@functools.cache
def artifact_suffix() -> str:
    """How compiled kernels are stored: ".so" (a shared library, loaded by TVM-FFI alone,
    without importing the DSL) when a C compiler is there to link one, else ".o" (the DSL's
    object file, whose loader imports the DSL)."""
    return ".so" if _linker() else ".o"


def _linker() -> str | None:
    return next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))), None)


def artifact_name(config: GemmConfig, signature: KernelSignature) -> str:
    """The file a compiled kernel is stored in: the binary's compile key, the signature's key
    and `artifact_suffix()`. The kernel cache and the tuner's compile workers share it, so
    tuning fills the cache and never compiles what it holds."""
    return f"{config.compile_key}__{signature.key}{artifact_suffix()}"


#: The kernel module of each architecture that has one (compile targets drop the "a").
KERNEL_MODULES = {
    "sm_90": ("gemmtune.kernels.sm90.kernel", "HopperGemm"),
    "sm_100": ("gemmtune.kernels.sm100.kernel", "BlackwellGemm"),
}


def import_compiler(target: str) -> None:
    """Import the DSL and the kernel modules for `target` (e.g. "sm_90a"): what every compile
    needs first, done once by a compile worker as it starts."""
    import importlib

    import cutlass  # noqa: F401

    kernel = KERNEL_MODULES.get(target.removesuffix("a"))
    if kernel is not None:
        importlib.import_module(kernel[0])


def export_gemm(kernel: CompiledGemm, path: Path) -> None:
    """Write a compiled kernel that `load_gemm` loads in any process: a shared library when
    `path` ends in ".so", else the DSL's object file."""
    if path.suffix != ".so":
        kernel.function.export_to_c(str(path), function_name=EXPORTED_FUNCTION)
        return
    from cutlass.runtime import find_runtime_libraries

    with tempfile.TemporaryDirectory() as folder:
        objects = Path(folder) / "gemm.o"
        kernel.function.export_to_c(str(objects), function_name=EXPORTED_FUNCTION)
        # Link against the very runtime libraries the DSL's own loader would load, and find
        # them again by path (rpath), so loading needs no environment.
        libraries = find_runtime_libraries(enable_tvm_ffi=True)
        rpaths = [f"-Wl,-rpath,{folder}" for folder in {str(Path(p).parent) for p in libraries}]
        command = [_linker() or "cc", "-shared", "-o", str(path), str(objects), *libraries, *rpaths]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"linking {path.name} failed: {done.stderr.strip()[-2000:]}")


def load_gemm(path: Path, config: GemmConfig, signature: KernelSignature) -> CompiledGemm:
    """Load a kernel written by `export_gemm` (no compile)."""
    start = time.perf_counter()
    if Path(path).suffix == ".so":
        import tvm_ffi

        module = tvm_ffi.load_module(str(path))
    else:
        import cutlass.cute as cute

        module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    function = getattr(module, EXPORTED_FUNCTION)
    return CompiledGemm(config, signature, function, time.perf_counter() - start)


def _fake_operand(
    dtype, rows, cols, batch, major_is_rows: bool, batched: bool, align: int, base_align: int = 16
):
    """A fake torch-ordered tensor (l?, rows, cols) whose contiguous dimension is rows or cols,
    its other strides divisible by `align` elements and its base by `base_align` bytes."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    lead = cute.sym_int64(divisibility=align)
    if major_is_rows:
        shape, stride = (rows, cols), (1, lead)
    else:
        shape, stride = (rows, cols), (lead, 1)
    if batched:
        shape = (batch, *shape)
        stride = (cute.sym_int64(divisibility=align), *stride)
    return make_fake_tensor(dtype, shape, stride, assumed_align=base_align)


#: The kernel entry a signature's binary is compiled from, by (scaled, with a bias), other than
#: the kernel's own call: a scaled (fp8) one takes the scales after `out`, one with a bias
#: takes it after those.
ENTRIES = {
    (True, False): "scaled",
    (False, True): "biased",
    (True, True): "scaled_biased",
}


def fake_arguments(signature: KernelSignature) -> tuple:
    """Fake (a, b, out, workspace, counters) for `signature`, sharing the symbolic M, N, K and L
    between a, b and out; a scaled signature's scales follow out (1-D fp32 of any length), then
    a bias (1-D, N elements of the output's type)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    from gemmtune.kernels.operands import DSL_DTYPES as types

    m, n, k = (cute.sym_int64(symbol=s) for s in "mnk")
    l = cute.sym_int64(symbol="l")
    ab_align = dtypes.ALIGNMENT_BYTES // dtypes.itemsize(signature.ab_dtype)
    out_align = dtypes.ALIGNMENT_BYTES // signature.out_bytes
    out_base_align = dtypes.ALIGNMENT_BYTES
    if not signature.out_aligned:
        out_align, out_base_align = 1, signature.out_bytes
    a_type, b_type = types[signature.ab_dtype], types[signature.b_input]
    a = _fake_operand(a_type, m, k, l, signature.a_major == "m", signature.batched, ab_align)
    b = _fake_operand(b_type, k, n, l, signature.b_major == "k", signature.batched, ab_align)
    out_dtype = types[signature.out_dtype]
    c = _fake_operand(
        out_dtype, m, n, l, signature.out_major == "m", signature.batched, out_align, out_base_align
    )
    workspace = make_fake_compact_tensor(
        cutlass.Float32, (cute.sym_int64(divisibility=4),), assumed_align=16
    )
    counters = make_fake_compact_tensor(cutlass.Int32, (cute.sym_int64(),), assumed_align=16)
    scales = []
    if signature.scaling:
        scales = [
            make_fake_compact_tensor(cutlass.Float32, (cute.sym_int64(),), assumed_align=4)
            for _ in "ab"
        ]
    bias = []
    if signature.bias:  # one element per column of the output, any address of its type
        bias = [make_fake_compact_tensor(out_dtype, (n,), assumed_align=signature.out_bytes)]
    return a, b, c, *scales, *bias, workspace, counters


def compile_gemm(
    config: GemmConfig,
    signature: KernelSignature,
    *,
    keep: tuple[str, ...] = (),
    dependent_launch: bool = True,
) -> CompiledGemm:
    """Compile the kernel `config` names for `signature`, for the DSL's current target.

    `keep` may name "ptx" and "sass" to keep those on the result (SASS needs nvdisasm, from
    the `nvidia-cuda-nvdisasm` wheel or a CUDA toolkit). `dependent_launch=False` builds a
    kernel launched the plain way (no programmatic dependent launch), for comparison.
    """
    import importlib

    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    module, kernel_class = KERNEL_MODULES[config.arch]  # every arch a GemmConfig allows
    start = time.perf_counter()
    built_for = signature.swapped() if config.swap_ab else signature
    if signature.bias and config.arch != "sm_90":
        raise ValueError(f"{config.key}: the Hopper kernel alone adds a bias")
    gemm_class = getattr(importlib.import_module(module), kernel_class)
    gemm = gemm_class(config, built_for, dependent_launch=dependent_launch)
    fakes = fake_arguments(signature)  # what the launch passes: the problem's own tensors
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    with tempfile.TemporaryDirectory() as dump:
        options = " ".join(["--enable-tvm-ffi", *(f"--keep-{what}" for what in keep)])
        if keep:
            options += f" --dump-dir {dump}"
        runtime = (cutlass.Int32(0), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1))
        variant = (bool(signature.scaling), signature.bias)
        entry = getattr(gemm, ENTRIES[variant]) if variant in ENTRIES else gemm
        function = cute.compile(entry, *fakes, *runtime, stream, options=options)
        ptx = function.__ptx__ if "ptx" in keep else None
        sass = function.__sass__ if "sass" in keep else None
    elapsed = time.perf_counter() - start
    log.debug("compiled %s for %s in %.2f s", config.compile_key, signature.key, elapsed)
    return CompiledGemm(config, signature, function, elapsed, ptx, sass)


#: Per architecture: the PTX of its MMA, and its SASS (Hopper's HGMMA, IGMMA for int8;
#: Blackwell's tcgen05 MMA as UTCHMMA and kin, UTCHMMA.2CTA for the pair's `cta_group::2` form).
MMA_INSTRUCTIONS = {
    "sm_90": ("wgmma.mma_async", r"\b[HIQ]GMMA\b"),
    "sm_100": ("tcgen05.mma", r"\bUTC\w*MMA\w*\b"),
}
#: The SASS of a 2-CTA MMA (`cta_group::2`)
TWO_CTA_MMA = r"\bUTC\w*MMA\w*\.2CTA\b"
#: A Hopper wait for every WGMMA in flight
MMA_DRAIN = r"\bWARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b"


def waits_after_every_mma(sass: str, mma_sass: str) -> bool:
    """Whether every MMA in `sass` is followed by a wait for all MMAs before the next one:
    what ptxas emits when it cannot prove that registers read between a WGMMA and its wait
    are not that WGMMA's accumulators (warning C7514, "wgmma.mma_async instructions are
    serialized"), so that no two WGMMAs of the kernel overlap. A WGMMA batch is several
    instructions (one per k-block), so a kernel that is not serialized has MMAs followed by
    another MMA."""
    events = re.finditer(rf"(?P<mma>{mma_sass})|{MMA_DRAIN}", sass)
    kinds = [e.lastgroup == "mma" for e in events]
    mmas = sum(kinds)
    drained = sum(1 for now, then in itertools.pairwise(kinds) if now and not then)
    return mmas > 0 and drained == mmas


@dataclass(frozen=True)
class BinaryReport:
    """What the compiler made of one kernel: the instructions we insist on, and spills."""

    config_key: str
    signature_key: str
    arch: str
    compile_s: float
    mma_in_ptx: bool  # the architecture's MMA (`MMA_INSTRUCTIONS`)
    waits_for_prior_grid: bool  # griddepcontrol.wait: it is launched as a dependent launch
    mma_in_sass: int
    local_memory_ops: int  # STL/LDL in SASS: register spills or local arrays
    tma_stores: int  # UTMASTG: the epilogue's TMA stores
    tmem_loads: int  # LDTM: tensor memory to registers (Blackwell's epilogue)
    tma_store_expected: bool  # the config's `tma_store`
    two_cta_mmas: int = 0  # MMAs of the 2-CTA form in SASS
    two_cta_expected: bool = False  # the config's `two_cta`
    serialized_mmas: bool = False  # `waits_after_every_mma`

    @property
    def ok(self) -> bool:
        return (
            self.mma_in_ptx
            and self.waits_for_prior_grid
            and self.mma_in_sass > 0
            and self.local_memory_ops == 0
            and (self.tma_stores > 0) == self.tma_store_expected
            and (self.tmem_loads > 0 or self.arch != "sm_100")
            and (self.two_cta_mmas > 0) == self.two_cta_expected
            and not self.serialized_mmas
        )


def inspect_gemm(config: GemmConfig, signature: KernelSignature) -> BinaryReport:
    """Compile with PTX and SASS kept, and count what matters in them."""
    kernel = compile_gemm(config, signature, keep=("ptx", "sass"))
    sass, ptx = kernel.sass or "", kernel.ptx or ""
    mma_ptx, mma_sass = MMA_INSTRUCTIONS[config.arch]
    return BinaryReport(
        config_key=config.compile_key,
        signature_key=signature.key,
        arch=config.arch,
        compile_s=kernel.compile_s,
        mma_in_ptx=mma_ptx in ptx,
        waits_for_prior_grid="griddepcontrol.wait" in ptx,
        mma_in_sass=len(re.findall(mma_sass, sass)),
        local_memory_ops=len(re.findall(r"\b(?:STL|LDL)\b", sass)),
        tma_stores=len(re.findall(r"\bUTMASTG\b", sass)),
        tmem_loads=len(re.findall(r"\bLDTM\b", sass)),
        tma_store_expected=config.tma_store,
        two_cta_mmas=len(re.findall(TWO_CTA_MMA, sass)),
        two_cta_expected=config.two_cta,
        serialized_mmas=waits_after_every_mma(sass, mma_sass),
    )
