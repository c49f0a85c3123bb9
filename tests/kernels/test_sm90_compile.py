"""Compile-only lane for the Hopper kernel (no GPU needed): every config the kernel implements
compiles for sm_90a, its PTX holds `wgmma` and `griddepcontrol.wait` (dependent launch), its
SASS holds HGMMA and no local-memory traffic (no spills); every dtype, layout and rank
compiles too."""

import dataclasses
import importlib.metadata as metadata
import itertools
import shutil

import pytest

from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm90 import rules
from gemmtune.workers.compiler import CompileJob, CompilePool, inspect_all

pytestmark = [pytest.mark.compile, pytest.mark.timeout(1800)]


def _has_nvdisasm() -> bool:
    try:
        metadata.version("nvidia-cuda-nvdisasm")
        return True
    except metadata.PackageNotFoundError:
        return shutil.which("nvdisasm") is not None


needs_nvdisasm = pytest.mark.skipif(
    not _has_nvdisasm(), reason="SASS needs nvdisasm (nvidia-cuda-nvdisasm, in the dev extra)"
)


@pytest.fixture(scope="module")
def pool():
    """Two compile workers: CI has two cores."""
    pool = CompilePool("sm_90a", max_workers=2)
    yield pool
    pool.stop_workers()


def _check(pool, jobs):
    reports = inspect_all(jobs, pool)
    bad = [r for r in reports if not r.ok]
    assert not bad, "\n".join(map(str, bad))
    return reports


@needs_nvdisasm
def test_every_implemented_config_compiles_to_hgmma_without_spills(pool):
    # 1086 binaries, every one serving 16-bit inputs: 906 here (108 of them narrow tiles with
    # 256-byte stages), the 180 of widths of an odd number of 8-column blocks in the test below
    # (each test within its own time limit on CI's two cores)
    implemented = rules.implemented_configs()
    configs = [c for c in implemented if c.tile_n not in rules.ODD_EIGHT_TILE_NS]
    assert (len(implemented), len(configs)) == (1086, 906)
    assert not [c for c in implemented if rules.signature_reason(c, KernelSignature())]
    reports = _check(pool, [CompileJob(c, KernelSignature()) for c in configs])
    assert {r.config_key for r in reports} == {c.compile_key for c in configs}


@needs_nvdisasm
def test_widths_of_an_odd_number_of_8_column_blocks_compile_for_16_bit_inputs(pool):
    """Their B stages (88 or 104 rows of 64 elements) and M-major output sub-tiles (192 x 8)
    are the layouts the DSL aborts slicing (`kernel.stage_layout`)."""
    configs = [c for c in rules.implemented_configs() if c.tile_n in rules.ODD_EIGHT_TILE_NS]
    assert len(configs) == 180
    m_major = KernelSignature("fp16", "fp16", "m", "k", "m", False)
    jobs = [CompileJob(c, KernelSignature() if i % 4 else m_major) for i, c in enumerate(configs)]
    reports = _check(pool, jobs)
    assert {r.config_key for r in reports} == {c.compile_key for c in configs}


@needs_nvdisasm
def test_every_tile_compiles_split_k_and_stream_k(pool):
    """Each tile, schedule and stage width with each decomposition that shares tiles, the
    cluster shapes and epilogues taken in turn (the reduction's code depends on the tile and
    the schedule)."""
    configs = rules.implemented_configs((Decomposition.SPLIT_K, Decomposition.STREAM_K))
    by_tile: dict = {}
    for c in configs:
        tile = (c.schedule, c.tile_m, c.tile_n, c.stage_k_bytes, c.decomposition)
        by_tile.setdefault(tile, []).append(c)
    chosen = [variants[i % len(variants)] for i, variants in enumerate(by_tile.values())]
    assert {c.decomposition for c in chosen} == {Decomposition.SPLIT_K, Decomposition.STREAM_K}
    jobs = [CompileJob(c, KernelSignature()) for c in chosen]
    assert not [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    _check(pool, jobs)


SIGNATURES = [
    KernelSignature(ab, out, am, bm, om, batched)
    for ab, out, (am, bm), om, batched in itertools.product(
        ("bf16", "fp16"),
        ("bf16", "fp16", "fp32"),
        (("k", "n"), ("k", "k"), ("m", "n"), ("m", "k")),
        ("n", "m"),
        (False, True),
    )
]
#: int8 x int8 -> int32: both operands K-major, either output major, either rank
INT8_SIGNATURES = [
    KernelSignature("int8", "int32", "k", "k", om, batched)
    for om, batched in itertools.product(("n", "m"), (False, True))
]
#: 8-bit inputs (both K-major): int8, and fp8 scaled per tensor and per row, e4m3 with e5m2
#: either way round, into each float output (promoted fp8 runs on the Hopper kernel only)
EIGHT_BIT_SIGNATURES = [
    *INT8_SIGNATURES,
    KernelSignature("e4m3", "bf16", "k", "k", "n", False, scaling="tensor"),
    KernelSignature("e4m3", "bf16", "k", "k", "m", False, scaling="row"),
    KernelSignature("e4m3", "fp32", "k", "k", "m", True, b_dtype="e5m2", scaling="row"),
    KernelSignature("e5m2", "fp16", "k", "k", "n", True, b_dtype="e4m3", scaling="tensor"),
    KernelSignature("e4m3", "bf16", "k", "k", "n", False, scaling="tensor", promoted=True),
    KernelSignature("e4m3", "fp32", "k", "k", "m", False, scaling="row", promoted=True),
]


@needs_nvdisasm
def test_every_signature_compiles(pool):
    # cooperative, ping-pong, swapped and narrow (decode) configs in turn, alternating the
    # epilogue; seven, so that each meets both ranks
    configs = [
        GemmConfig(tile_m=256, tile_n=208, cluster_n=2, swap_ab=True),
        GemmConfig(tile_m=128, tile_n=256, cluster_m=2),
        GemmConfig(tile_m=256, tile_n=192, cluster_n=2, tma_store=False),
        GemmConfig(tile_m=256, tile_n=128, tma_store=False),
        GemmConfig(tile_m=64, tile_n=256, schedule="pingpong", cluster_m=2, cluster_n=2),
        GemmConfig(tile_m=128, tile_n=16, swap_ab=True),
        GemmConfig(tile_m=64, tile_n=48, schedule="pingpong", cluster_m=2, tma_store=False),
    ]
    jobs = [CompileJob(configs[i % len(configs)], sig) for i, sig in enumerate(SIGNATURES)]
    refused = [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    # the rules refuse what spills (batched 256x208; 256x192 thread stores to an M-major or
    # fp32 output)
    assert {j.config.tile_n for j in refused} == {192, 208}
    _check(pool, [j for j in jobs if j not in refused])


@needs_nvdisasm
def test_wide_per_row_binaries_compile_without_spills(pool):
    """Per-row scales are read from shared memory (`scaling.stage_tile_scales`): the binaries
    that spilled reading them from global memory after the mainloop (34 local-memory
    operations at 128x176 ping-pong, 38 at 256x176 cooperative, 27 split by 2) do not."""
    row = KernelSignature("e4m3", "bf16", "k", "k", "n", False, scaling="row")
    configs = [
        GemmConfig(tile_m=128, tile_n=176, schedule="pingpong", cluster_n=2),
        GemmConfig(tile_m=256, tile_n=176),
        GemmConfig(tile_m=256, tile_n=160, decomposition="stream_k"),
        GemmConfig(tile_m=128, tile_n=160, schedule="pingpong", decomposition="split_k", splits=2),
        GemmConfig(tile_m=128, tile_n=128, schedule="pingpong", tma_store=False),
    ]
    assert not [c for c in configs if rules.signature_reason(c, row)]
    _check(pool, [CompileJob(config, row) for config in configs])


@needs_nvdisasm
def test_thread_stores_below_their_register_limits_compile_without_spills(pool):
    """Just below `rules.thread_store_register_limit`: 128 accumulators with per-row scales
    into an M-major fp32 output aside (4-10 local-memory operations, left served), the tiles
    beneath each limit compile clean."""
    fp32 = KernelSignature("bf16", "fp32", "k", "n", "m")
    row = KernelSignature("e4m3", "bf16", "k", "k", "m", scaling="row")
    jobs = [
        CompileJob(GemmConfig(tile_m=128, tile_n=144, schedule="pingpong", tma_store=False), fp32),
        CompileJob(GemmConfig(tile_m=256, tile_n=144, tma_store=False), fp32),
        CompileJob(GemmConfig(tile_m=256, tile_n=128, tma_store=False), row),
        CompileJob(GemmConfig(tile_m=128, tile_n=128, schedule="pingpong", tma_store=False), row),
    ]
    assert not [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    _check(pool, jobs)


#: outputs TMA cannot store (`out_aligned` false): every output type, both majors, both ranks
UNALIGNED_SIGNATURES = [
    KernelSignature("bf16", "bf16", "k", "k", "n", out_aligned=False),
    KernelSignature("fp16", "fp32", "k", "n", "m", True, out_aligned=False),
    KernelSignature("int8", "int32", "k", "k", "n", out_aligned=False),
    KernelSignature("e4m3", "bf16", "k", "k", "m", False, scaling="row", out_aligned=False),
]


@needs_nvdisasm
def test_unaligned_outputs_compile_with_thread_stores_in_every_decomposition(pool):
    """A data-parallel, a split-K (which stores from the reduction) and a stream-K binary,
    swapped or not, for each signature of an output TMA cannot store."""
    configs = [
        GemmConfig(tile_m=128, tile_n=176, cluster_n=2, tma_store=False),
        GemmConfig(
            tile_m=64,
            tile_n=32,
            schedule="pingpong",
            swap_ab=True,
            tma_store=False,
            decomposition=Decomposition.SPLIT_K,
            splits=2,
        ),
        GemmConfig(tile_m=128, tile_n=128, tma_store=False, decomposition=Decomposition.STREAM_K),
    ]
    jobs = [CompileJob(c, sig) for c in configs for sig in UNALIGNED_SIGNATURES]
    assert not [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    _check(pool, jobs)


@needs_nvdisasm
def test_eight_bit_compiles_in_every_decomposition(pool):
    """int8 and fp8 (both operands K-major, IGMMA and QGMMA): cooperative, ping-pong, swapped
    and narrow tiles, both epilogues, both output majors and ranks, split-K and stream-K (int8's
    partials int32, fp8's scaled fp32), per-tensor and per-row scales, promoted fp8."""
    configs = [
        GemmConfig(tile_m=128, tile_n=256, cluster_m=2),
        GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True, tma_store=False),
        GemmConfig(tile_m=128, tile_n=128, decomposition="split_k", splits=4),
        GemmConfig(tile_m=64, tile_n=192, schedule="pingpong", decomposition="stream_k"),
        GemmConfig(tile_m=128, tile_n=64, swap_ab=True, tma_store=False, decomposition="stream_k"),
        # widths of an odd number of 8-column blocks: sub-tiles 8 wide, two stmatrix matrices
        GemmConfig(tile_m=256, tile_n=88, cluster_m=2, swap_ab=True),
        GemmConfig(tile_m=64, tile_n=168, schedule="pingpong", decomposition="split_k", splits=4),
        GemmConfig(tile_m=64, tile_n=56, schedule="pingpong", cluster_n=2, swap_ab=True),
    ]
    jobs = [CompileJob(c, sig) for c in configs for sig in EIGHT_BIT_SIGNATURES]
    refused = [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    # promoted fp8 holds two register tiles: 128x256's 128 accumulators per thread do not fit;
    # int8 WGMMAs take no N of an odd number of 8-column blocks beyond 24
    assert {(j.config.tile_n, j.signature.promoted, j.signature.fp8) for j in refused} == {
        (256, True, True),
        *((n, False, False) for n in (56, 88, 168)),
    }
    jobs = [j for j in jobs if j not in refused]
    reports = _check(pool, jobs)
    assert all(r.mma_in_sass > 0 for r in reports)


@needs_nvdisasm
def test_promoted_fp8_compiles_two_promotion_steps_per_wide_stage(pool):
    """Narrow decode tiles with 256-byte stages, promoted: two steps of 128 elements per stage,
    consecutive stages alternating between two pairs of register tiles of partial sums (one
    pair where five tiles do not fit: 128x48 ping-pong), in each decomposition; none with
    serialized WGMMAs (`_check`)."""
    configs = [
        GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True, stage_k_bytes=256),
        GemmConfig(tile_m=128, tile_n=32, swap_ab=True, stage_k_bytes=256, tma_store=False,
                   decomposition="split_k", splits=4),
        GemmConfig(tile_m=64, tile_n=48, schedule="pingpong", stage_k_bytes=256,
                   decomposition="stream_k"),
        GemmConfig(tile_m=128, tile_n=48, schedule="pingpong", swap_ab=True, stage_k_bytes=256),
    ]  # fmt: skip
    promoted = [sig for sig in EIGHT_BIT_SIGNATURES if sig.promoted]
    jobs = [CompileJob(c, sig) for c in configs for sig in promoted]
    assert all(rules.promotion_steps(j.config) == 2 for j in jobs)
    assert [rules.promotion_buffers(c) for c in configs] == [4, 4, 4, 2]
    assert not [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    reports = _check(pool, jobs)
    assert all(r.mma_in_sass > 0 for r in reports)


@needs_nvdisasm
def test_promoted_fp8_tiles_of_72_accumulators_hold_two_partial_tiles_without_spills(pool):
    """128x144 cooperative and 64x144 ping-pong tiles, promoted, TMA-stored, data-parallel:
    three register tiles of 72 in 240 registers (`rules.LEAN_PROMOTED_OVERHEAD_REGISTERS`),
    per tensor and per row, each output type, both ranks."""
    configs = [
        GemmConfig(tile_m=128, tile_n=144, cluster_m=2),
        GemmConfig(tile_m=128, tile_n=144, swap_ab=True),
        GemmConfig(tile_m=64, tile_n=144, schedule="pingpong", cluster_n=2),
    ]
    signatures = [
        *(sig for sig in EIGHT_BIT_SIGNATURES if sig.promoted),
        KernelSignature("e5m2", "fp16", "k", "k", "n", True, b_dtype="e4m3", scaling="tensor",
                        promoted=True),
    ]  # fmt: skip
    assert [rules.promotion_buffers(c) for c in configs] == [2, 2, 2]
    jobs = [CompileJob(c, sig) for c in configs for sig in signatures]
    assert not [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    _check(pool, jobs)


@needs_nvdisasm
def test_192_row_tiles_beside_the_refused_ones_compile_batched_without_spills(pool):
    # the neighbours of `rules.BATCHED_SPILLING_TILES`, on two clusters and both epilogues
    batched = KernelSignature(batched=True)
    configs = [
        GemmConfig(tile_m=192, tile_n=128),
        GemmConfig(tile_m=192, tile_n=192, cluster_m=2, tma_store=False),
    ]
    assert all(rules.signature_reason(c, batched) is None for c in configs)
    _check(pool, [CompileJob(c, batched) for c in configs])


@needs_nvdisasm
def test_thread_stores_of_192_row_tiles_to_m_major_outputs_compile(pool):
    """Three warpgroups' thread stores to a 16-bit M-major output (the swapped kernel of
    every row-major problem) and to a 4-byte one, data-parallel and sharing tiles; a 128-row
    tile's beside them."""
    m_major = KernelSignature("bf16", "bf16", "k", "n", out_major="m")
    stores = GemmConfig(tile_m=192, tile_n=160, tma_store=False)
    jobs = [
        CompileJob(stores, KernelSignature("bf16", "fp32", "k", "n", out_major="m")),
        CompileJob(stores, m_major),
        CompileJob(GemmConfig(tile_m=192, tile_n=96, tma_store=False), m_major),
        CompileJob(
            dataclasses.replace(stores, decomposition=Decomposition.SPLIT_K, splits=2), m_major
        ),
        CompileJob(
            GemmConfig(tile_m=192, tile_n=128, tma_store=False, decomposition="stream_k"),
            KernelSignature("fp16", "fp16", "m", "k", out_major="m"),
        ),
        CompileJob(GemmConfig(tile_m=128, tile_n=160, tma_store=False), m_major),
    ]
    assert not [j for j in jobs if rules.signature_reason(j.config, j.signature)]
    _check(pool, jobs)


@needs_nvdisasm
def test_constant_b_binaries_compile_without_spills(pool):
    # swapped or not, multicast of b or of a, every decomposition, fp8: the early loads of
    # b's first stages and the late ones of a beside the mainloop's (which operand goes
    # early: `tests/kernels/test_constant_b.py`)
    fp8 = KernelSignature("e4m3", "bf16", "k", "k", scaling="tensor", constant_b=True)
    cases = [
        (GemmConfig(tile_m=64, tile_n=16, cluster_m=4, swap_ab=True, schedule="pingpong",
                    stage_k_bytes=256), KernelSignature(constant_b=True)),
        (GemmConfig(tile_m=128, tile_n=16, cluster_m=2, swap_ab=True, schedule="pingpong",
                    stage_k_bytes=256, decomposition=Decomposition.SPLIT_K, splits=4), fp8),
        (GemmConfig(tile_m=64, tile_n=48, schedule="pingpong", stage_k_bytes=256,
                    decomposition=Decomposition.STREAM_K), KernelSignature(constant_b=True)),
        (GemmConfig(tile_m=128, tile_n=256, cluster_n=2),
         KernelSignature(b_major="k", constant_b=True)),
    ]  # fmt: skip
    _check(pool, [CompileJob(config, signature) for config, signature in cases])


@needs_nvdisasm
def test_bias_binaries_below_their_register_limits_compile_without_spills(pool):
    """A bias (`kernels/bias.py`) along the tile's columns or, swapped, its rows (in registers,
    or a shared buffer for split-K), in every decomposition, 16-bit and fp8 (per tensor, per
    row, promoted), each tile at the largest or just below the limit
    `rules.bias_register_limit` or `rules.thread_store_register_limit` sets."""
    bf16 = KernelSignature("bf16", "bf16", "k", "k", "n", bias=True)
    fp16_m = KernelSignature("fp16", "fp32", "k", "k", "m", bias=True)
    tensor = KernelSignature("e4m3", "bf16", "k", "k", "n", scaling="tensor", bias=True)
    row = KernelSignature("e4m3", "bf16", "k", "k", "n", scaling="row", bias=True)
    promoted = dataclasses.replace(tensor, promoted=True)
    split_k, stream_k = Decomposition.SPLIT_K, Decomposition.STREAM_K
    cases = [
        (GemmConfig(tile_m=256, tile_n=208, swap_ab=True), bf16),
        (GemmConfig(tile_m=128, tile_n=208, schedule="pingpong", swap_ab=True,
                    decomposition=stream_k), tensor),
        (GemmConfig(tile_m=192, tile_n=160, swap_ab=True, decomposition=stream_k), bf16),
        (GemmConfig(tile_m=256, tile_n=208, cluster_n=2), bf16),
        (GemmConfig(tile_m=128, tile_n=256, decomposition=stream_k), bf16),
        (GemmConfig(tile_m=128, tile_n=176, tma_store=False, decomposition=split_k, splits=2),
         fp16_m),
        (GemmConfig(tile_m=128, tile_n=128, schedule="pingpong", tma_store=False), bf16),
        (GemmConfig(tile_m=192, tile_n=112, tma_store=False), bf16),
        (GemmConfig(tile_m=64, tile_n=16, cluster_m=4, swap_ab=True, schedule="pingpong",
                    stage_k_bytes=256, decomposition=split_k, splits=2), bf16),
        (GemmConfig(tile_m=128, tile_n=160, cluster_m=4, schedule="pingpong"), tensor),
        (GemmConfig(tile_m=128, tile_n=144, schedule="pingpong", decomposition=split_k,
                    splits=2), row),
        (GemmConfig(tile_m=128, tile_n=168, schedule="pingpong", swap_ab=True), row),
        (GemmConfig(tile_m=64, tile_n=192, schedule="pingpong", swap_ab=True, tma_store=False,
                    decomposition=stream_k), row),
        (GemmConfig(tile_m=128, tile_n=112, schedule="pingpong", swap_ab=True,
                    decomposition=split_k, splits=2), row),
        (GemmConfig(tile_m=128, tile_n=144, cluster_m=2), promoted),
        (GemmConfig(tile_m=64, tile_n=16, cluster_m=4, swap_ab=True, schedule="pingpong",
                    stage_k_bytes=256), promoted),
    ]  # fmt: skip
    assert not [c for c, s in cases if rules.signature_reason(c, s)]
    _check(pool, [CompileJob(config, signature) for config, signature in cases])
