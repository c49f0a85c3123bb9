"""Compile-only lane for the Blackwell kernel (no B200 needed): every config the kernel
implements compiles for sm_100a with tcgen05 MMAs in its PTX and SASS (UTC*MMA; the 2-CTA form
UTC*MMA.2CTA exactly where `two_cta`), tensor-memory loads in its epilogue (LDTM), TMA stores
exactly where `tma_store`, and no local memory; each tile compiles split-K and stream-K too, and
every dtype, layout and rank. Building a kernel also checks `rules.smem_plan` and
`rules.tmem_plan` against the DSL's layouts."""

import pytest
from test_sm90_compile import (
    EIGHT_BIT_SIGNATURES,
    INT8_SIGNATURES,
    SIGNATURES,
    UNALIGNED_SIGNATURES,
    _check,
    needs_nvdisasm,
)

from gemmtune.core.config import Decomposition, GemmConfig
from gemmtune.kernels.signature import KernelSignature
from gemmtune.kernels.sm100 import rules
from gemmtune.workers.compiler import CompileJob, CompilePool

pytestmark = [pytest.mark.compile, pytest.mark.timeout(1800)]


#: a 2-CTA pair, split-K, storing directly: the reduction writes the output itself
PAIR_SPLIT_K_DIRECT = GemmConfig(
    arch="sm_100",
    tile_m=256,
    tile_n=64,
    cluster_m=2,
    two_cta=True,
    tma_store=False,
    decomposition="split_k",
    splits=3,
)


@pytest.fixture(scope="module")
def pool():
    pool = CompilePool("sm_100a", max_workers=2)
    yield pool
    pool.stop_workers()


@needs_nvdisasm
def test_every_implemented_config_compiles_to_tcgen05_without_spills(pool):
    configs = rules.implemented_configs()
    assert len(configs) == 800
    reports = _check(pool, [CompileJob(c, KernelSignature()) for c in configs])
    assert {r.config_key for r in reports} == {c.compile_key for c in configs}
    assert all(r.tmem_loads > 0 and r.mma_in_sass > 0 for r in reports)


@needs_nvdisasm
def test_every_tile_compiles_split_k_and_stream_k(pool):
    """Each MMA tile (1-CTA and 2-CTA) with each decomposition that shares tiles, the cluster
    shapes and epilogues taken in turn (the reduction's code depends on the tile)."""
    configs = rules.implemented_configs((Decomposition.SPLIT_K, Decomposition.STREAM_K))
    assert len(configs) == 1600
    by_tile: dict = {}
    for c in configs:
        by_tile.setdefault((c.tile_m, c.tile_n, c.two_cta, c.decomposition), []).append(c)
    chosen = [variants[i % len(variants)] for i, variants in enumerate(by_tile.values())]
    assert {c.decomposition for c in chosen} == {Decomposition.SPLIT_K, Decomposition.STREAM_K}
    assert {c.tma_store for c in chosen} == {True, False}
    reports = _check(pool, [CompileJob(c, KernelSignature()) for c in chosen])
    assert all(r.tmem_loads > 0 and r.mma_in_sass > 0 for r in reports)


@needs_nvdisasm
def test_int8_compiles_in_every_decomposition(pool):
    """int8 x int8 -> int32 (tcgen05 kind::i8, int32 accumulators in tensor memory): one CTA and
    a pair, both epilogues, both output majors and ranks, split-K and stream-K."""
    configs = [
        GemmConfig(arch="sm_100", tile_m=128, tile_n=256),
        GemmConfig(
            arch="sm_100", tile_m=256, tile_n=128, cluster_m=2, two_cta=True, tma_store=False
        ),
        GemmConfig(arch="sm_100", tile_m=64, tile_n=32, swap_ab=True),
        GemmConfig(arch="sm_100", tile_m=128, tile_n=128, decomposition="split_k", splits=2),
        GemmConfig(
            arch="sm_100",
            tile_m=256,
            tile_n=64,
            cluster_m=2,
            two_cta=True,
            tma_store=False,
            decomposition="stream_k",
        ),
    ]
    reports = _check(pool, [CompileJob(c, sig) for c in configs for sig in INT8_SIGNATURES])
    assert all(r.tmem_loads > 0 and r.mma_in_sass > 0 for r in reports)


#: fp8 with fast accumulation (the Blackwell kernel takes no promoted products): scaled per
#: tensor and per row, e4m3 with e5m2 either way round, into each float output and rank
FP8_SIGNATURES = [
    s for s in EIGHT_BIT_SIGNATURES if s.ab_dtype != "int8" and not s.promoted
]  # fmt: skip


@needs_nvdisasm
def test_fp8_compiles_scaled_per_tensor_and_per_row_in_every_decomposition(pool):
    """fp8 (tcgen05 kind::f8f6f4, fp32 accumulators in tensor memory, the scales applied as the
    epilogue loads each sub-tile): one CTA and a pair, both epilogues, swapped (the scales
    trade places), split-K and stream-K."""
    assert len(FP8_SIGNATURES) == 4
    configs = [
        GemmConfig(arch="sm_100", tile_m=128, tile_n=256),
        GemmConfig(
            arch="sm_100", tile_m=256, tile_n=128, cluster_m=2, two_cta=True, tma_store=False
        ),
        GemmConfig(arch="sm_100", tile_m=64, tile_n=32, swap_ab=True, tma_store=False),
        GemmConfig(arch="sm_100", tile_m=128, tile_n=128, decomposition="split_k", splits=2),
        PAIR_SPLIT_K_DIRECT,
        GemmConfig(arch="sm_100", tile_m=128, tile_n=64, swap_ab=True, decomposition="stream_k"),
    ]
    jobs = [CompileJob(c, s) for i, c in enumerate(configs) for s in FP8_SIGNATURES[i % 2 :: 2]]
    reports = _check(pool, jobs)
    assert all(r.tmem_loads > 0 and r.mma_in_sass > 0 for r in reports)


@needs_nvdisasm
def test_every_signature_compiles(pool):
    configs = [
        GemmConfig(arch="sm_100", tile_m=128, tile_n=256),
        GemmConfig(arch="sm_100", tile_m=256, tile_n=128, cluster_m=2, two_cta=True),
        GemmConfig(arch="sm_100", tile_m=64, tile_n=96, cluster_n=2, tma_store=False),
        GemmConfig(
            arch="sm_100", tile_m=128, tile_n=64, cluster_m=2, two_cta=True, tma_store=False
        ),
        GemmConfig(arch="sm_100", tile_m=128, tile_n=32, cluster_m=4),
        GemmConfig(arch="sm_100", tile_m=128, tile_n=128, decomposition="stream_k"),
        PAIR_SPLIT_K_DIRECT,
    ]
    _check(pool, [CompileJob(configs[i % len(configs)], s) for i, s in enumerate(SIGNATURES)])


@needs_nvdisasm
def test_direct_stores_compile_without_spills_to_every_output_major_and_width(pool):
    """The widest tiles and those that spilled when a direct store took the whole tile at once,
    one CTA and a pair, to M-major outputs of 2 and 4 bytes and to an N-major fp32 one."""
    tiles = [(64, 128, False), (64, 256, False), (128, 64, False), (128, 256, False)]
    tiles += [(128, 160, True), (256, 256, True)]
    configs = [
        GemmConfig(
            arch="sm_100",
            tile_m=tile_m,
            tile_n=tile_n,
            cluster_m=2 if pair else 1,
            two_cta=pair,
            tma_store=False,
        )
        for tile_m, tile_n, pair in tiles
    ]
    signatures = [
        KernelSignature("fp16", "fp32", "k", "n", out_major="m"),
        KernelSignature("bf16", "bf16", "k", "n", out_major="m"),
        KernelSignature("fp16", "fp32", "k", "n"),
        KernelSignature("int8", "int32", "k", "k", out_major="m"),
    ]
    _check(pool, [CompileJob(c, s) for c in configs for s in signatures])


@needs_nvdisasm
def test_unaligned_outputs_compile_with_direct_stores(pool):
    """Outputs TMA cannot store (the Hopper lane's N-major signatures but fp8, which runs on
    Hopper only): one CTA and a pair, data-parallel and split-K."""
    configs = [
        GemmConfig(arch="sm_100", tile_m=128, tile_n=128, tma_store=False),
        PAIR_SPLIT_K_DIRECT,
    ]
    signatures = [s for s in UNALIGNED_SIGNATURES if not s.fp8 and s.out_major == "n"]
    _check(pool, [CompileJob(c, s) for c in configs for s in signatures])
