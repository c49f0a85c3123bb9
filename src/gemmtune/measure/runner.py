"""What a benchmark worker runs: one problem's tensors, and candidate kernels timed on them.

A `GemmRunner` lives in the benchmark worker (`workers.bench`). It builds the problem's inputs
once, from `torch.randn` (int8: uniform over all 256 values) with a fixed seed, so every
candidate multiplies the same tensors, and the reference (float32, or exact int32 for int8);
then, per candidate, it loads the compiled kernel, poisons the output (`verify.poison`), runs
it, checks the result and only then times it. torch's own contender is `torch.matmul`,
`torch._int_mm` for int8 (`problem.integer_matmul`) or `torch._scaled_mm` for fp8, for which
cuBLASLt has no algorithm on some problems (`torch_declines`): those have none.

A memory-bound kernel's time can depend on where in memory its operands lie: on an H100, swapped
128x32 tiles in clusters of 2x1 read a 16 x 10240 x 8192 fp8 product in 33.6 µs at two
allocations of the weight and 35.5 µs at three others, bf16 16 x 8192 x 8192 in 50.5 against
56.1, while clusters of four and cuBLAS stayed within 1.2 % (`docs/tuning.md`). Timed at the
worker's one allocation, the tuner picked configs that ran 6 % slower at the caller's. So a
spec may ask for several `placements`: copies of the operands at different addresses, each run
taking the next, and every contender's median is over all of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gemmtune.core.config import CUBLAS, GemmConfig
from gemmtune.core.problem import (
    declined_by_cublas,
    integer_matmul,
    scaled_matmul,
    scaled_reference,
)
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.transpose import copying_launcher
from gemmtune.measure.timing import IdleWarmup, L2Flusher, as_graph, time_cuda, time_in_windows
from gemmtune.measure.verify import check, poison


@dataclass(frozen=True)
class ProblemSpec:
    """A problem to build in the worker: sizes, signature, device, seed."""

    m: int
    n: int
    k: int
    l: int
    signature: KernelSignature
    device_index: int = 0
    seed: int = 0
    #: operands built in the layout the signature's kernel cannot read, and copied K-major
    #: before every run of a kernel (`GemmProblem.copied`): the copy is timed with it
    copied: tuple[str, ...] = ()
    #: copies of a and b at different addresses that the runs take in turn: at most this many,
    #: as the GPU's free memory allows (`placements_for`)
    placements: int = 1


#: What the extra placements of a problem's operands may hold in all, and at most how many
#: there are: four copies of a 10240 x 8192 fp8 weight (84 MB) showed every allocation class
#: seen in the measurements of the module docstring.
PLACEMENT_BYTES = 2 << 30
MAX_PLACEMENTS = 4


def placements_for(operand_bytes: int, free_bytes: int | None = None) -> int:
    """How many placements of operands of `operand_bytes` to time a memory-bound problem on:
    as many as `MAX_PLACEMENTS` whose bytes fit `PLACEMENT_BYTES`, and whose extra copies
    take at most a quarter of `free_bytes` (the GPU's free memory, where known), at least 1."""
    fit = PLACEMENT_BYTES // max(operand_bytes, 1)
    if free_bytes is not None:
        fit = min(fit, 1 + free_bytes // (4 * max(operand_bytes, 1)))
    return int(max(1, min(MAX_PLACEMENTS, fit)))


def placed_copies(
    a: torch.Tensor, b: torch.Tensor, placements: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(a, b) and `placements - 1` copies of them (same values and strides), each pair
    allocated after a gap of an odd number of MiB, so that the copies start at other offsets
    of the GPU's pages and memory partitions than the originals do."""
    copies, gaps = [(a, b)], []
    for i in range(1, placements):
        gaps.append(torch.empty((2 * i + 1) << 20, dtype=torch.uint8, device=a.device))
        keep = torch.preserve_format
        copies.append((a.clone(memory_format=keep), b.clone(memory_format=keep)))
    return copies


def fitting_copies(
    a: torch.Tensor, b: torch.Tensor, at_most: int = MAX_PLACEMENTS
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`placed_copies` of GPU operands, at most `at_most` placements and as many as
    `placements_for` allows in the GPU's free memory."""
    free = torch.cuda.mem_get_info(a.device)[0]
    return placed_copies(a, b, min(at_most, placements_for(a.nbytes + b.nbytes, free)))


def taking_turns(
    launch: Callable[[torch.Tensor, torch.Tensor], object],
    placed: list[tuple[torch.Tensor, torch.Tensor]],
    graph: bool = False,
) -> Callable[[], None]:
    """A function whose every call runs `launch(a, b)` on the next of the `placed` operands;
    with `graph`, each placement's launch replays a CUDA graph of its own (`as_graph`)."""
    runs = [lambda a=a, b=b: launch(a, b) for a, b in placed]
    if graph:
        runs = [as_graph(run) for run in runs]
    if len(runs) == 1:
        return runs[0]
    turn = itertools.cycle(runs)
    return lambda: next(turn)()


@dataclass(frozen=True)
class RunJob:
    """Verify, then time `config`, whose binary is the object file at `kernel_path`."""

    config_json: str
    kernel_path: str
    warmup_ms: float = 10.0
    runs: int = 10
    graph: bool = False  # time replays of a CUDA graph
    kind: str = "measure"


@dataclass(frozen=True)
class CompareJob:
    """Time several verified configs each alone, in windows taken in turn (`time_in_windows`):
    the fair way to decide between close finalists, each at the clocks its own power allows,
    as a caller runs it. A config named `CUBLAS` (with any kernel path) is torch.matmul, run
    as a caller without `out` would."""

    configs_json: tuple[str, ...]
    kernel_paths: tuple[str, ...]
    window_ms: float = 30.0
    rounds: int = 3
    graph: bool = False
    #: A window of a kernel of a few microseconds is bound by the host's launches, not the
    #: GPU: its runs are capped so that the window stays short in wall time too.
    max_runs: int = 200
    #: each round starts at another contender (`time_in_windows`)
    rotate: bool = True
    kind: str = "compare"


@dataclass(frozen=True)
class Measurement:
    """A candidate's median time, or why it has none."""

    config_key: str
    ms: float | None
    spread: float = 0.0
    rel_err: float = math.nan
    error: str | None = None


def make_operands(spec: ProblemSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random a, b and an output with the majors and dtypes of `spec.signature` (the operands
    in `spec.copied` in the other major, as the caller gives them)."""
    sig = spec.signature
    gen = torch.Generator(device=f"cuda:{spec.device_index}").manual_seed(spec.seed)
    lead = (spec.l,) if sig.batched else ()
    device = torch.device("cuda", spec.device_index)

    def rand(rows: int, cols: int, column_major: bool, dtype: torch.dtype) -> torch.Tensor:
        shape = (*lead, cols, rows) if column_major else (*lead, rows, cols)
        t = random_tensor(shape, dtype, device, gen)
        return t.transpose(-1, -2) if column_major else t

    a = rand(spec.m, spec.k, sig.a_major == "m" or "a" in spec.copied, sig.ab_torch_dtype)
    b = rand(spec.k, spec.n, sig.b_major == "k" and "b" not in spec.copied, sig.b_torch_dtype)
    out_shape = (*lead, spec.n, spec.m) if sig.out_major == "m" else (*lead, spec.m, spec.n)
    out = torch.empty(out_shape, device=device, dtype=sig.out_torch_dtype)
    return a, b, out.transpose(-1, -2) if sig.out_major == "m" else out


def random_tensor(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device | str = "cuda",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The inputs every contender multiplies: `torch.randn` (fp8: rounded to it), or for int8
    integers drawn uniformly from all 256 values (small integers would make any kernel look
    faster)."""
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, device=device, dtype=dtype, generator=generator)
    if dtype.itemsize == 1:
        return torch.randn(shape, device=device, generator=generator).to(dtype)
    return torch.randn(shape, device=device, dtype=dtype, generator=generator)


def random_scales(
    signature: KernelSignature, m: int, n: int, device, generator=None
) -> tuple[torch.Tensor, ...]:
    """Scales of a scaled (fp8) signature in the shapes `torch._scaled_mm` takes them: one
    element each ("tensor"), or (m, 1) and (1, n) ("row"); drawn from [0.5, 1.5). None for
    other signatures: ()."""
    if not signature.scaling:
        return ()
    rows, cols = ((m, 1), (1, n)) if signature.scaling == "row" else ((), ())
    return tuple(
        torch.rand(shape, device=device, generator=generator) + 0.5 for shape in (rows, cols)
    )


def random_bias(
    signature: KernelSignature, n: int, k: int, device, generator=None
) -> torch.Tensor | None:
    """A bias for a signature with one, one element per column of the output in its type, as
    large as the product's elements (randn times the square root of K): a kernel that left it
    out fails the check. None for other signatures."""
    if not signature.bias:
        return None
    bias = torch.randn(n, device=device, generator=generator) * math.sqrt(k)
    return bias.to(signature.out_torch_dtype)


def reference_product(
    a: torch.Tensor, b: torch.Tensor, scales: tuple = (), bias: torch.Tensor | None = None
) -> torch.Tensor:
    """What a candidate's output is checked against: a float32 product (fp8: scaled by
    `scales`) plus `bias`, exact int32 for int8."""
    if a.dtype == torch.int8:
        return integer_matmul(a, b)
    product = scaled_reference(a, b, *scales) if scales else torch.matmul(a.float(), b.float())
    return product if bias is None else product + bias.float()


def torch_product(
    a: torch.Tensor,
    b: torch.Tensor,
    scales: tuple = (),
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = True,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """torch's answer to `a @ b` (plus `bias`), the contender ours must beat: torch.matmul
    (cuBLAS; torch.addmm with a bias), torch._int_mm for int8, torch._scaled_mm for fp8 (with
    `scales`, `out_dtype` and `use_fast_accum`)."""
    if a.dtype == torch.int8:
        return integer_matmul(a, b)
    if scales:
        return scaled_matmul(a, b, *scales, out_dtype, use_fast_accum, bias)
    if bias is not None:
        return torch.addmm(bias, a, b) if a.dim() == 2 else torch.matmul(a, b) + bias
    return torch.matmul(a, b)


def torch_declines(
    a: torch.Tensor,
    b: torch.Tensor,
    scales: tuple,
    out_dtype: torch.dtype,
    use_fast_accum: bool,
    bias: torch.Tensor | None,
) -> str | None:
    """Why cuBLASLt declines an fp8 product torch has checked (no algorithm for some sizes
    with per-row scales and a bias: `declined_by_cublas`), None where torch takes it, refuses
    it as a wrong call, or the product is not fp8. Declined, `torch._scaled_mm` raises for
    the caller, and `torch_product`'s float32 stand-in is no time of torch's: a tune then
    times no torch contender. (A call torch refuses as wrong, a layout `tuned_gemm` copies,
    keeps the stand-in, what `tuned_gemm` runs where torch serves it.)"""
    if not scales:
        return None
    options = {"out_dtype": out_dtype, "use_fast_accum": use_fast_accum, "bias": bias}
    try:
        torch._scaled_mm(a, b, *scales, **options)
    except RuntimeError as error:
        if declined_by_cublas(error):
            return f"torch._scaled_mm declines the problem: {error}"
    return None


class GemmRunner:
    """The worker-side state of one tuning run."""

    def __init__(self, spec: ProblemSpec):
        torch.cuda.set_device(spec.device_index)
        self.spec = spec
        self.a, self.b, self.out = make_operands(spec)
        self.placed = fitting_copies(self.a, self.b, spec.placements)
        gen = torch.Generator(device=self.a.device).manual_seed(spec.seed + 1)
        self.scales = random_scales(spec.signature, spec.m, spec.n, self.a.device, gen)
        from gemmtune.kernels.launch import kernel_scales

        self.bias = random_bias(spec.signature, spec.n, spec.k, self.a.device, gen)
        # what the kernel takes after (a, b, out): the scales, then the bias
        self.kernel_extras = (*kernel_scales(self.scales), *self.biases)
        self.reference = reference_product(self.a, self.b, self.scales, self.bias)
        self.flush = L2Flusher(spec.device_index)
        self.kernels: dict[str, object] = {}
        fast = not spec.signature.promoted
        self.torch_declines = torch_declines(
            self.a, self.b, self.scales, self.out.dtype, fast, self.bias
        )  # fmt: skip
        self.idle = IdleWarmup()
        self.idle.warm(lambda: self._cublas(self.a, self.b))  # the first kernels still compile

    def _kernel(self, path: str, config: GemmConfig):
        from gemmtune.kernels.build import load_gemm

        if path not in self.kernels:
            self.kernels[path] = load_gemm(path, config, self.spec.signature)
        return self.kernels[path]

    def _launcher(self, config: GemmConfig, kernel_path: str) -> Callable[..., None]:
        """The config's kernel as a function of the operands (a, b)."""
        from gemmtune.kernels.launch import launch_args

        kernel = self._kernel(kernel_path, config)
        s = self.spec
        args = launch_args(
            config, self.a.device, s.m, s.n, s.k, s.l, ab_bytes=s.signature.ab_bytes
        )  # fmt: skip

        if s.copied:
            kernel = copying_launcher(kernel, s.copied)

        def launch(a: torch.Tensor, b: torch.Tensor) -> None:
            kernel(a, b, self.out, *self.kernel_extras, *args)

        return launch

    @property
    def biases(self) -> tuple:
        return () if self.bias is None else (self.bias,)

    def _cublas(self, a: torch.Tensor, b: torch.Tensor) -> None:
        fast = not self.spec.signature.promoted
        torch_product(a, b, self.scales, self.out.dtype, fast, self.bias)

    def compare(self, job: CompareJob) -> list[Measurement]:
        """Each config's time, in the job's order; torch's (`CUBLAS`) none where cuBLASLt
        declines the problem (`torch_declines`)."""
        keys, runs = [], []
        for text, path in zip(job.configs_json, job.kernel_paths, strict=True):
            if text == CUBLAS:
                if self.torch_declines is None:
                    keys.append(CUBLAS)
                    runs.append(taking_turns(self._cublas, self.placed, job.graph))
            else:
                config = GemmConfig.from_json(text)
                keys.append(config.key)
                runs.append(taking_turns(self._launcher(config, path), self.placed, job.graph))
        timings = (
            time_in_windows(
                runs,
                window_ms=job.window_ms,
                rounds=job.rounds,
                max_runs=job.max_runs,
                flush=self.flush,
                rotate=job.rotate,
            )
            if runs
            else []
        )
        self.idle.timed()
        timed = iter(
            Measurement(k, t.median_ms, t.spread) for k, t in zip(keys, timings, strict=True)
        )
        return [
            Measurement(CUBLAS, None, error=self.torch_declines)
            if text == CUBLAS and self.torch_declines is not None
            else next(timed)
            for text in job.configs_json
        ]

    def measure(self, job: RunJob) -> Measurement:
        config = GemmConfig.from_json(job.config_json)
        launch = self._launcher(config, job.kernel_path)
        poison(self.out)
        launch(self.a, self.b)
        torch.cuda.synchronize()
        ok, err = check(self.out, self.reference, self.a.dtype)
        if not ok:
            return Measurement(
                config.key, None, rel_err=err, error=f"wrong result: rel err {err:.3g}"
            )
        timing = time_cuda(
            taking_turns(launch, self.placed, job.graph),
            warmup_ms=self.idle.warmup_ms(job.warmup_ms),
            runs=job.runs,
            flush=self.flush,
        )
        self.idle.timed()
        return Measurement(config.key, timing.median_ms, timing.spread, err)

    @staticmethod
    def poisoned(error: BaseException) -> bool:
        """True when `error` leaves the CUDA context unusable (a fault): restart the worker."""
        text = str(error)
        return "CUDA" in text or "cuda" in text or "illegal" in text
