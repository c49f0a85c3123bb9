import dataclasses

import pytest
import torch

from gemmtune.core.config import Decomposition, GemmConfig, Raster, Schedule
from gemmtune.core.device import Arch
from gemmtune.core.problem import GemmProblem, Operand
from gemmtune.kernels.sm90.rules import ODD_EIGHT_TILE_NS
from gemmtune.space import candidates, shortlist
from gemmtune.space.ranking import (
    FIRST_RASTER,
    DeviceModel,
    RankingModel,
    family,
    full_swizzle_constants,
    in_first_order,
    load_calibration,
)
from gemmtune.space.shortlist import CLASS_MARGIN, TIE_MARGIN, reads_larger_once, tie_key


def problem(m, n, k, linear=False):
    """`a @ b` with row-major operands, or with `linear` a layer's `x @ w.t()` (b K-major)."""

    def operand(rows, cols, column_major=False):
        stride = (1, rows) if column_major else (cols, 1)
        return Operand((rows, cols), stride, torch.bfloat16, torch.device("cuda", 0), 1 << 20)

    return GemmProblem.from_operands(operand(m, k), operand(k, n, linear), arch=Arch.SM90)


FLAT = {"families": {}, "publish_us_per_kb": 0.01, "gather_us_per_kb": 0.01}


def test_calibration_ships_every_sm90_family_but_the_narrow_ones():
    from gemmtune.kernels.sm90 import rules

    calibration = load_calibration("sm_90")
    configs = rules.implemented_configs()
    # widths of an odd number of 8-column blocks take constants interpolated
    # between the fitted widths around them (`full_swizzle_constants`)
    odd = {family(c) for c in configs if c.tile_n in ODD_EIGHT_TILE_NS}
    wide = {family(c) for c in configs if c.tile_n >= rules.FITTED_MIN_TILE_N} - odd
    narrow = {family(c) for c in configs} - wide - odd
    assert wide <= set(calibration["families"])
    assert odd and not odd & set(calibration["families"])
    assert narrow and not narrow & set(calibration["families"])
    assert all(a > 0 and c >= 0 for a, c in calibration["families"].values())


def test_8bit_problems_are_predicted_from_the_8bit_families_and_others_are_not():
    # 176 wide is not a multiple of 64: 16-bit families (B N-major) are interpolated for a
    # K-major B, 8-bit ones were timed K-major and are taken as fitted
    config = GemmConfig(tile_m=128, tile_n=176, schedule="pingpong")
    neighbours = {
        family(dataclasses.replace(config, tile_n=128)): [0.2, 2.0],
        family(config): [0.5, 9.0],
        family(dataclasses.replace(config, tile_n=192)): [0.3, 3.0],
    }
    eight_bit = {family(config): [0.1, 1.0]}
    model = RankingModel(calibration={**FLAT, "families": neighbours, "families_8bit": eight_bit})
    fp8 = fp8_linear(4096, 4096, 4096)
    assert model.constants(config, ab_bytes=1)[:2] == (0.1, 1.0)
    assert model.constants(config)[:2] == (0.5, 9.0)
    waves = 768 // 132 + 1  # 32 x 24 tiles of 128x176
    assert model.predict_us(fp8, config) == pytest.approx(waves * (0.1 * 32 + 1.0), rel=1e-3)
    # without 8-bit families, an 8-bit problem takes the 16-bit ones (interpolated: K-major B)
    plain = RankingModel(calibration={**FLAT, "families": neighbours})
    assert plain.predict_us(fp8, config) == pytest.approx(waves * (0.275 * 32 + 2.75), rel=1e-3)
    # a family the 8-bit timings did not cover takes its 16-bit constants
    direct = dataclasses.replace(config, tma_store=False)
    covered = {**neighbours, family(direct): [0.4, 5.0]}
    mixed = RankingModel(calibration={**FLAT, "families": covered, "families_8bit": eight_bit})
    assert mixed.constants(direct, ab_bytes=1)[:2] == (0.4, 5.0)
    assert mixed.constants(config, ab_bytes=1)[:2] == (0.1, 1.0)


def test_a_narrow_swizzle_width_is_predicted_at_its_width_where_b_gets_the_full_swizzle():
    # 176 columns of an N-major B get a 32-byte swizzle: the fitted family is twice as slow per
    # k-tile as the 128- and 192-wide ones around it; K-major (a linear layer's weight) it is not
    config = GemmConfig(tile_m=64, tile_n=176, schedule="pingpong")
    families = {
        family(GemmConfig(tile_m=64, tile_n=128, schedule="pingpong")): [0.2, 2.0],
        family(config): [0.5, 9.0],
        family(GemmConfig(tile_m=64, tile_n=192, schedule="pingpong")): [0.28, 3.0],
    }
    assert full_swizzle_constants(families, config) == pytest.approx((0.26, 2.75))
    model = RankingModel(calibration={**FLAT, "families": families})
    row_major, linear = problem(333, 4096, 4096), problem(333, 4096, 4096, linear=True)
    assert model.predict_us(linear, config) < 0.7 * model.predict_us(row_major, config)


def test_an_odd_width_under_64_takes_the_64_wide_family_scaled_to_its_width():
    config = GemmConfig(tile_m=64, tile_n=56, schedule="pingpong", swap_ab=True)
    families = {family(GemmConfig(tile_m=64, tile_n=64, schedule="pingpong")): [0.4, 8.0]}
    assert full_swizzle_constants(families, config) == pytest.approx((0.35, 7.0))
    # the narrow decode tiles keep their analytic constants
    assert full_swizzle_constants(families, dataclasses.replace(config, tile_n=48)) is None
    # 100 rows in two tiles of 56 do 12 % less MMA work than in two of 64, in as many CTAs
    # (cuBLASLt's tiling of Qwen2.5-7B's down projection at 100 rows, fp8)
    model = RankingModel()
    p = fp8_linear(100, 3584, 18944)
    top = model.top_k(p, candidates(p, orders=False), 8)
    assert any(c.tile_n == 56 and c.swap_ab for c in top)


@pytest.mark.parametrize("linear", [False, True])
def test_ragged_problems_rank_their_measured_leaders(linear):
    # measured on an H200 (kernels alone): 333 x 4096 x 4096 in swapped 64x176 c1x2 tiles (333
    # rows in two tiles, the weight multicast to both) 20.1 µs, cuBLAS 23.0, the best tile
    # without the 176 width 24.6; 640 x 1800 x 3000 in swapped 128x80 c1x4 tiles 18.0 µs (one
    # wave of 120), the same in c1x2 clusters 20.6
    model = RankingModel()
    ragged = problem(333, 4096, 4096, linear=linear)
    top = {c.compile_key for c in model.top_k(ragged, candidates(ragged, orders=False), 8)}
    assert "sm90_64x176_c1x2_swap_pp_tma_dp" in top
    mid = problem(640, 1800, 3000)
    top = {c.compile_key for c in model.top_k(mid, candidates(mid, orders=False), 8)}
    assert top & {"sm90_128x80_c1x4_swap_pp_tma_dp", "sm90_128x80_c1x4_swap_coop_tma_dp"}


@pytest.mark.parametrize("m", [1, 16])
def test_decode_batches_rank_narrow_swapped_tiles_first(m):
    # measured leaders of 16 x 6144 x 4096 (an 8B qkv projection): 128x16 and 64x16 swapped
    # tiles, 2-5 % ahead of 64-wide ones; each tile takes one place, whatever its cluster shapes
    p = problem(m, 6144, 4096, linear=True)
    top = RankingModel().top_k(p, candidates(p, orders=False), 8)
    assert top[0].tile_n == 16 and top[0].swap_ab
    assert all(c.tile_n <= 32 and c.swap_ab for c in top[:2])


@pytest.mark.parametrize("m", [1, 16])
def test_decode_batches_rank_wide_stages_ahead_of_128_byte_ones(m):
    # 16 x 6144 x 4096 and 16 x 6144 x 16384 on an H100: narrow swapped tiles with 256-byte
    # stages ran 3-6 % faster than the same tiles with 128-byte ones
    model = RankingModel()
    p = problem(m, 6144, 4096, linear=True)
    top = model.top_k(p, candidates(p, orders=False), 8)
    assert all(c.stage_k_bytes == 256 for c in top if c.tile_n in (16, 32, 48))
    narrow = dataclasses.replace(top[0], stage_k_bytes=128)
    assert model.predict_us(p, top[0]) < model.predict_us(p, narrow)


def test_wide_stages_take_no_place_where_the_mma_bounds():
    # 4096^3: every narrow tile is bound by its MMAs, where the two widths predict alike
    p = problem(4096, 4096, 4096)
    configs = candidates(p, orders=False)
    wide = [c for c in configs if c.stage_k_bytes == 256]
    assert wide
    model = RankingModel()
    for config in wide[:20]:
        twin = dataclasses.replace(config, stage_k_bytes=128)
        assert model.predict_us(p, config) == pytest.approx(model.predict_us(p, twin))
    assert all(c.stage_k_bytes == 128 for c in model.top_k(p, configs, 8))


def test_cluster_shapes_predicted_alike_take_one_place():
    # 4 x 28672 x 4096, x @ w (an 8B gate-up projection at decode): the top 8 held two swapped
    # 128x32 tiles in three cluster shapes each; the 128x16 cooperative tile, 4-7 % faster
    # than the tuned pick on an H200, was not among them
    model = RankingModel()
    p = problem(4, 28672, 4096)
    configs = candidates(p, orders=False)
    top = model.top_k(p, configs, 8)
    assert len({tie_key(c) for c in top}) == len(top)
    assert "sm90_128x16_c1x1_swap_coop_tma_k256_dp" in {c.compile_key for c in top}
    best = top[0]
    other = dataclasses.replace(best, cluster_m=2)
    assert other in configs and other not in top
    assert model.predict_us(p, other) <= model.predict_us(p, best) * (1 + TIE_MARGIN)


def test_epilogue_variants_predicted_alike_take_one_place():
    # 4 x 4096 x 14336 (an 8B down projection, decode): the 64x16 swapped stream-K tile sits
    # at the memory floor in three cluster shapes, each with both epilogues, predicted alike;
    # they held six of eight places, and the 128x16 split-K tile that beat them came eighth
    model = RankingModel()
    p = problem(4, 4096, 14336, linear=True)
    configs = candidates(p, orders=False)
    top = model.top_k(p, configs, 8)
    assert len({tie_key(c) for c in top}) == len(top)
    # the premise: the best's twin with the other epilogue was predicted within the margin
    best = top[0]
    twin = dataclasses.replace(best, tma_store=not best.tma_store)
    assert twin in configs
    assert model.predict_us(p, twin) <= model.predict_us(p, best) * (1 + TIE_MARGIN)


def test_wave_quantization_in_the_prediction():
    model = RankingModel(DeviceModel(), FLAT)
    config = GemmConfig(tile_m=128, tile_n=128)
    one_wave = model.predict_us(problem(128 * 12, 128 * 11, 4096), config)  # 132 tiles
    two_waves = model.predict_us(problem(128 * 12, 128 * 11 + 1, 4096), config)  # 144 tiles
    assert two_waves > 1.9 * one_wave


def test_split_k_and_stream_k_win_where_data_parallel_leaves_sms_idle():
    model = RankingModel(DeviceModel(), FLAT)
    p = problem(512, 512, 32768)  # 16 tiles of 128x128 on 132 SMs, K long
    dp = model.predict_us(p, GemmConfig())
    sk = model.predict_us(p, GemmConfig(decomposition="split_k", splits=8))
    streamk = model.predict_us(p, GemmConfig(decomposition="stream_k"))
    assert sk < dp / 3 and streamk < dp / 3
    # but not on a problem that fills the GPU in whole waves
    full = problem(128 * 12, 128 * 11, 4096)
    assert model.predict_us(full, GemmConfig()) < model.predict_us(
        full, GemmConfig(decomposition="split_k", splits=2)
    )


def test_memory_bound_floor():
    model = RankingModel(DeviceModel(hbm_bytes_per_us=1.0e3), FLAT)  # a very slow memory
    p = problem(1024, 1024, 1024)
    bytes_moved = (1024 * 1024 * 2) * 3
    assert model.predict_us(p, GemmConfig()) == bytes_moved / 1.0e3


def test_top_k_takes_default_runtime_configs_in_order():
    p = problem(4096, 4096, 4096)
    model = RankingModel()
    top = model.top_k(p, candidates(p), 8)
    assert len(top) == 8 and all(c.swizzle == 1 and c.raster.value == "along_m" for c in top)
    predicted = [model.predict_us(p, c) for c in top]
    assert predicted == sorted(predicted)
    # the fitted model puts the measured winners of this shape first
    assert any(c.tile_m * c.tile_n >= 128 * 192 for c in top[:3])


@dataclasses.dataclass(frozen=True)
class PingPongScaled(RankingModel):
    """The shipped model with every ping-pong prediction multiplied by `factor`."""

    factor: float = 1.0

    def predict_us(self, problem, config):
        us = super().predict_us(problem, config)
        return us * self.factor if config.schedule is Schedule.PINGPONG else us


def test_top_k_gives_every_close_class_of_kernel_a_place():
    p = problem(8192, 8192, 8192)
    space = candidates(p, orders=False)
    shipped = RankingModel(DeviceModel())
    coop = sorted(shipped.predict_us(p, c) for c in space if c.schedule is Schedule.COOPERATIVE)
    pingpong = min(shipped.predict_us(p, c) for c in space if c.schedule is Schedule.PINGPONG)
    # the best ping-pong tile predicted behind the eighth cooperative one, but within the class
    # margin of the first: by predicted time alone the eight are all cooperative tiles
    assert coop[7] < coop[0] * (1 + CLASS_MARGIN)
    factor = (coop[7] + coop[0] * (1 + CLASS_MARGIN)) / 2 / pingpong
    model = PingPongScaled(DeviceModel(), factor=factor)
    plain = [c for _, c in model.rank(p, space)][:8]
    top = model.top_k(p, space, 8)
    assert {c.schedule.value for c in plain} == {"cooperative"}
    assert {c.schedule.value for c in top} == {"cooperative", "pingpong"}
    predicted = [model.predict_us(p, c) for c in top]
    assert predicted == sorted(predicted)
    pingpong_places = [
        t for c, t in zip(top, predicted, strict=True) if c.schedule is Schedule.PINGPONG
    ]
    assert max(pingpong_places) <= predicted[0] * (1 + CLASS_MARGIN)
    assert model.top_k(p, space, 1) == plain[:1]  # the first choice is still the fastest


def test_top_k_spends_no_place_on_a_stream_k_twin_predicted_alike():
    model = RankingModel(DeviceModel(), FLAT)
    dp = GemmConfig(tile_m=128, tile_n=128)
    stream_k = GemmConfig(tile_m=128, tile_n=128, decomposition="stream_k")
    whole_waves = problem(128 * 12, 128 * 11, 4096)  # 132 tiles: stream-K has nothing to do
    assert model.predict_us(whole_waves, stream_k) == model.predict_us(whole_waves, dp)
    assert model.top_k(whole_waves, [dp, stream_k], 2) == [dp]
    # where it is predicted faster it takes its place, ahead of its twin
    few_tiles = problem(512, 512, 32768)
    assert model.top_k(few_tiles, [dp, stream_k], 2) == [stream_k, dp]


def test_an_operand_one_cluster_row_reads_streams_once():
    # M = 128: a 64-row tile in a 2x1 cluster spans all of M, so B (4096 x 14336) is read by
    # one cluster row and multicast; in a 1x2 cluster two cluster rows read it
    slow_memory = DeviceModel(hbm_bytes_per_us=1.0e4)
    calibration = dict(FLAT, reread_fraction=0.5, overlap_penalty=0.0)
    model = RankingModel(slow_memory, calibration)
    p = problem(128, 4096, 14336)
    spans_m = model.predict_us(
        p, GemmConfig(tile_m=64, tile_n=64, schedule="pingpong", cluster_m=2)
    )
    shares_b = model.predict_us(
        p, GemmConfig(tile_m=64, tile_n=64, schedule="pingpong", cluster_n=2)
    )
    b_bytes = 4096 * 14336 * 2
    assert shares_b - spans_m == pytest.approx(0.5 * b_bytes / 1.0e4)


def test_a_cluster_spanning_the_short_side_reads_the_larger_operand_once():
    p = problem(128, 6144, 4096)  # b is the larger: read once where one cluster spans M
    assert reads_larger_once(GemmConfig(tile_m=64, tile_n=96, cluster_m=2), p)
    assert not reads_larger_once(GemmConfig(tile_m=64, tile_n=96), p)
    assert reads_larger_once(GemmConfig(tile_m=128, tile_n=48), p)
    # swapped, b is the kernel's A, multicast along the cluster's N (the 128 rows of a)
    assert reads_larger_once(GemmConfig(tile_m=64, tile_n=128, cluster_m=4, swap_ab=True), p)
    ragged = problem(333, 4096, 4096, linear=True)
    swapped = GemmConfig(tile_m=64, tile_n=176, schedule="pingpong", swap_ab=True)
    assert reads_larger_once(dataclasses.replace(swapped, cluster_n=2), ragged)
    assert not reads_larger_once(dataclasses.replace(swapped, cluster_m=2), ragged)
    tall = problem(4096, 128, 4096)  # a is the larger
    assert reads_larger_once(GemmConfig(tile_m=128, tile_n=64, cluster_n=2), tall)
    assert not reads_larger_once(GemmConfig(tile_m=128, tile_n=64, cluster_m=2), tall)


def fp8_linear(m, n, k):
    return GemmProblem.of_shape(
        m,
        n,
        k,
        dtype=torch.float8_e4m3fn,
        out_dtype=torch.bfloat16,
        layout="tt",
        device="cuda:0",
        arch=Arch.SM90,
        scaling="tensor",
    )


def test_top_k_adds_a_pingpong_tile_of_128_accumulators_to_compute_bound_8_bit_problems():
    """fp8 on an H200, each config beside torch._scaled_mm in windows: ping-pong 128x128 in
    clusters of 2x1 ran 2048^3 per row in 17.3 µs (the suites' 128x176 20.7) and 4096^3 per
    tensor in 95.6 µs (the top 8's leaders 99.9-102.7), tiles the 16-bit families rank far
    down: the best predicted comes after the top 8."""
    from gemmtune.core.config import Decomposition
    from gemmtune.kernels.sm90.rules import accumulator_registers

    def small_pingpong(c):
        return (
            c.schedule is Schedule.PINGPONG
            and c.decomposition is Decomposition.DATA_PARALLEL
            and accumulator_registers(c) == shortlist.EIGHT_BIT_PINGPONG_REGISTERS
        )

    model = RankingModel()
    for m, n, k in ((4096, 4096, 4096), (2048, 2048, 2048)):
        p = fp8_linear(m, n, k)
        top = model.top_k(p, candidates(p, orders=False), 8)
        assert not any(small_pingpong(c) for c in top[:8])
        assert small_pingpong(top[-1]) and not top[-1].swap_ab and top[-1].tma_store
        assert top[-1].cluster_m * top[-1].cluster_n == 2
        assert model.tiles_per_sm(p, top[-1]) > 1
    # none for 16-bit inputs, a memory-bound decode batch, or a problem whose tiles of that
    # size are fewer than the SMs (one tile to a CTA: nothing for the other warpgroup)
    for p in (problem(4096, 4096, 4096, linear=True), fp8_linear(16, 4096, 4096)):
        top = model.top_k(p, candidates(p, orders=False), 8)
        assert not any(small_pingpong(c) for c in top[8:])
    p = fp8_linear(333, 4096, 4096)
    top = model.top_k(p, candidates(p, orders=False), 8)
    assert not any(small_pingpong(c) for c in top[8:])


def test_pads_cluster_counts_the_tiles_along_each_side_of_the_cluster():
    p = fp8_linear(1024, 4352, 4096)  # 8 tiles of 128 rows, 31 of 144 columns
    tile = GemmConfig(arch="sm_90", tile_m=128, tile_n=144, schedule=Schedule.PINGPONG)
    assert shortlist.pads_cluster(dataclasses.replace(tile, cluster_m=1, cluster_n=2), p)
    assert not shortlist.pads_cluster(dataclasses.replace(tile, cluster_m=2, cluster_n=1), p)
    assert shortlist.pads_cluster(dataclasses.replace(tile, cluster_m=1, cluster_n=4), p)
    assert not shortlist.pads_cluster(tile, p)
    # a swapped config's kernel cuts the transposed output: 34 tiles of 128 weight rows
    swapped = dataclasses.replace(tile, swap_ab=True, cluster_m=2, cluster_n=1)
    assert not shortlist.pads_cluster(swapped, p)
    assert not shortlist.pads_cluster(dataclasses.replace(swapped, cluster_m=1, cluster_n=2), p)


def test_top_k_adds_the_unpadded_twin_of_a_padded_cluster_of_two():
    """fp8 1024 x 4352 x 4096 on an H200: ping-pong 128x144 in clusters of 1x2 (the top 8's,
    one CTA of the last cluster column idle) 33.0-33.5 µs, in clusters of 2x1 29.9-31.0: the
    twin comes after the k. None for a memory-bound decode batch."""
    model = RankingModel()
    p = fp8_linear(1024, 4352, 4096)
    top = model.top_k(p, candidates(p, orders=False), 8)
    padded = [
        c
        for c in top[:8]
        if c.cluster_m * c.cluster_n == 2
        and c.decomposition is Decomposition.DATA_PARALLEL
        and shortlist.pads_cluster(c, p)
    ]
    assert padded
    for config in padded:
        twin = dataclasses.replace(config, cluster_m=config.cluster_n, cluster_n=config.cluster_m)
        assert twin in top[8:]
        assert not shortlist.pads_cluster(twin, p)
    assert len(top) == len(set(top))
    # a decode batch streams the weight: no twin, however padded its clusters
    p = fp8_linear(16, 4352, 4096)
    assert model.memory_bound(p)
    offered = set(candidates(p, orders=False))
    padded = list(padded_twins_of(offered, p))
    assert padded
    assert shortlist._unpadded_twins(model, p, padded, offered) == []


def padded_twins_of(offered, p):
    """The data-parallel clusters of two in `offered` that pad, whose twin does not."""
    found = set()
    for c in offered:
        twin = dataclasses.replace(c, cluster_m=c.cluster_n, cluster_n=c.cluster_m)
        if (
            c.cluster_m * c.cluster_n == 2
            and c.decomposition is Decomposition.DATA_PARALLEL
            and shortlist.pads_cluster(c, p)
            and twin in offered
            and not shortlist.pads_cluster(twin, p)
        ):
            found.add(c)
    return found


def even_widths(space):
    """`space` without the widths of an odd number of 8-column blocks."""
    return [c for c in space if c.tile_n not in ODD_EIGHT_TILE_NS]


def test_top_k_adds_a_config_that_reads_the_weight_once_where_none_does(monkeypatch):
    # fp8 333 x 4096 x 4096 on an H200: swapped 64x176 in clusters of 1x2 (the weight tile
    # multicast to both tiles of the 333 rows) 14.1 µs, in clusters of 2x1 17.3, the tuned
    # 128x112 15.2-15.6; the model's favourite fetches the weight in three clusters, and so
    # does every config of its top 8 but for the twins that take places in it: without them,
    # the best that fetches it once is timed as a ninth
    monkeypatch.setattr(shortlist, "ONCE_TWIN_SHAPES", ())
    p = fp8_linear(333, 4096, 4096)
    model = RankingModel()
    space = even_widths(candidates(p, orders=False))
    ranked = [c for _, c in model.rank(p, space)]
    assert not reads_larger_once(ranked[0], p)
    top = model.top_k(p, space, 8)
    assert len(top) == 9 and top[-1].compile_key == "sm90_64x176_c1x2_swap_pp_tma_dp"
    assert not any(reads_larger_once(c, p) for c in top[:8])
    # the same in bf16, whose top 8 holds it: nothing added; nor to a decode batch's, whose
    # favourite reads the weight once
    for m, dtype in ((333, torch.bfloat16), (16, torch.float8_e4m3fn)):
        other = GemmProblem.of_shape(
            m,
            4096,
            4096,
            dtype=dtype,
            out_dtype=torch.bfloat16,
            layout="tt",
            device="cuda:0",
            arch=Arch.SM90,
            scaling="tensor" if dtype.itemsize == 1 else None,
        )
        assert len(model.top_k(other, candidates(other, orders=False), 8)) == 8


def test_a_one_wave_config_that_reads_the_weight_twice_gives_its_place_to_its_twin(monkeypatch):
    # fp8 128 x 6144 x 4096 on an H200: 64x96 in clusters of 2x1 12.1 µs, unclustered 13.9, in
    # 1x2 14.0; the model ranks the 1x2 shape first of the three
    model = RankingModel()
    p = fp8_linear(128, 6144, 4096)
    space = candidates(p, orders=False)
    top = model.top_k(p, space, 8)
    assert "sm90_64x96_c2x1_pp_tma_dp" in {c.compile_key for c in top}
    assert len(top) == len(set(top)) == 8
    one_wave = [c for c in top if c.decomposition.value == "data_parallel"]
    assert all(reads_larger_once(c, p) for c in one_wave if model.one_wave(p, c))
    # 333 rows: the swapped 64x176 in clusters of 1x2 (14.1 µs against 17.3 in 2x1) comes in
    # as a twin, and the top 8 needs no ninth
    p = fp8_linear(333, 4096, 4096)
    top = model.top_k(p, even_widths(candidates(p, orders=False)), 8)
    assert len(top) == 8 and "sm90_64x176_c1x2_swap_pp_tma_dp" in {c.compile_key for c in top}
    # with the odd widths, cuBLASLt's own tile there (swapped 64x168 in clusters of two, two
    # tiles for the 333 rows) reads the weight once in the top 8
    top = model.top_k(p, candidates(p, orders=False), 8)
    assert "sm90_64x168_c1x2_swap_pp_tma_dp" in {c.compile_key for c in top[:8]}
    # problems that are not skewed, or of many waves, keep their top 8
    for other in (problem(4096, 4096, 4096), problem(16, 28672, 4096, linear=True)):
        space = candidates(other, orders=False)
        with_twins = model.top_k(other, space, 8)
        monkeypatch.setattr(shortlist, "ONCE_TWIN_SHAPES", ())
        assert model.top_k(other, space, 8) == with_twins
        monkeypatch.undo()


def test_partial_tiles_cost_time_even_when_memory_bound():
    slow_memory = DeviceModel(hbm_bytes_per_us=1.0e3)
    p = problem(512, 512, 32768)
    config = GemmConfig(decomposition="split_k", splits=8)
    free = RankingModel(slow_memory, dict(FLAT, publish_us_per_kb=0.0, gather_us_per_kb=0.0))
    costly = RankingModel(slow_memory, dict(FLAT, publish_us_per_kb=0.5, gather_us_per_kb=0.5))
    tile_kb = 128 * 128 * 4 / 1024
    assert costly.predict_us(p, config) - free.predict_us(p, config) == pytest.approx(tile_kb)


def test_split_k_partials_add_nothing_to_the_memory_floor():
    # a split-K wave writes its partials and reads them back from L2: a slow memory makes the
    # floor bind, and splitting deeper must not raise it
    slow_memory = RankingModel(DeviceModel(hbm_bytes_per_us=1.0e3), FLAT)
    p = problem(512, 512, 32768)
    floors = [
        slow_memory.predict_us(p, GemmConfig(decomposition="split_k", splits=s))
        - slow_memory.constants(GemmConfig(decomposition="split_k", splits=s))[2] * 2
        for s in (2, 4, 8)
    ]
    assert floors == pytest.approx([floors[0]] * 3)


def test_small_mn_long_k_on_an_h100_times_deep_splits_of_128x128_tiles():
    # 512 x 512 x 32768 and 256 x 1024 x 65536 on an H100: 128x128 tiles split by 8 in clusters
    # of two led (36.7-37.9 and 69.4-71.3 µs), 128x64 split by 4 took 42.5 and 85.6
    h100 = RankingModel(DeviceModel.for_gpu("NVIDIA H100 80GB HBM3", 132, {1: 132, 2: 66, 4: 30}))
    for m, n, k in ((512, 512, 32768), (256, 1024, 65536)):
        p = problem(m, n, k, linear=True)
        top = h100.top_k(p, candidates(p, orders=False), 8)
        deep = [c for c in top if (c.tile_m, c.tile_n, c.splits) == (128, 128, 8)]
        assert any(c.cluster_m * c.cluster_n == 2 for c in deep), [c.key for c in top]


def test_split_k_waits_once_per_wave_whatever_the_tile():
    p = problem(512, 512, 32768)
    calm = RankingModel(DeviceModel(), FLAT)
    waiting = RankingModel(DeviceModel(), dict(FLAT, split_k_wait_us=6.0))
    # 16 tiles of 128x128 x 8 splits and 64 tiles of 64x64 x 2 splits: one wave each on 132 SMs
    for config in (
        GemmConfig(decomposition="split_k", splits=8),
        GemmConfig(tile_m=64, tile_n=64, schedule="pingpong", decomposition="split_k", splits=2),
    ):
        assert waiting.predict_us(p, config) - calm.predict_us(p, config) == pytest.approx(6.0)
    # 16 tiles x 16 splits = 256 items: two waves wait
    two_waves = GemmConfig(decomposition="split_k", splits=16)
    assert waiting.predict_us(p, two_waves) - calm.predict_us(p, two_waves) == pytest.approx(12.0)
    # data-parallel and stream-K launches do not wait for splits
    for config in (GemmConfig(), GemmConfig(decomposition="stream_k")):
        assert waiting.predict_us(p, config) == calm.predict_us(p, config)


def test_a_wide_stage_has_a_family_of_its_own():
    # constants are per k-tile, and a 256-byte k-tile is twice a 128-byte one's work: a wide
    # tile never takes its 128-byte twin's fitted constants
    narrow = GemmConfig(tile_m=64, tile_n=32, schedule="pingpong", swap_ab=True)
    wide = dataclasses.replace(narrow, stage_k_bytes=256)
    assert family(wide) != family(narrow)
    model = RankingModel(calibration={"families": {family(narrow): [0.5, 1.0]}})
    assert model.constants(narrow)[:2] == (0.5, 1.0)
    a_wide = model.constants(wide)[0]
    a_analytic = RankingModel(calibration={}).constants(narrow)[0]
    assert a_wide == pytest.approx(2 * a_analytic)


def test_thread_stores_are_ranked_only_where_tma_cannot_store_the_output():
    model = RankingModel()
    # rows of 4,200 bytes: TMA cannot store them, and thread stores are all the space has
    ragged = problem(2050, 2100, 2000, linear=True)
    assert not ragged.out_aligned
    top = model.top_k(ragged, candidates(ragged, orders=False), 8)
    assert len(top) == 8 and not any(c.tma_store for c in top)
    # rows of 4,224: the TMA store's binaries take every place, whatever the fitted families
    # predict for their thread-store twins
    aligned = problem(2050, 2112, 2000, linear=True)
    space = candidates(aligned, orders=False)
    assert any(not c.tma_store for c in space)
    picks = model.top_k(aligned, space, 8)
    assert len(picks) == 8 and all(c.tma_store for c in picks)


def test_short_store_rows_follow_the_sub_tile_and_the_output_major():
    linear = problem(2050, 2112, 2000, linear=True)  # bf16, row-major output
    wide = GemmConfig(tile_m=192, tile_n=176)  # 16-column sub-tiles: rows of 32 bytes
    assert shortlist.short_store_rows(wide, linear)
    assert not shortlist.short_store_rows(dataclasses.replace(wide, swap_ab=True), linear)
    assert not shortlist.short_store_rows(GemmConfig(tile_m=192, tile_n=192), linear)
    m_major = dataclasses.replace(linear, out_major="m")
    assert not shortlist.short_store_rows(wide, m_major)
    assert shortlist.short_store_rows(dataclasses.replace(wide, swap_ab=True), m_major)
    fp32_out = dataclasses.replace(linear, out_dtype=torch.float32)  # rows of 64 bytes
    assert not shortlist.short_store_rows(wide, fp32_out)


def test_of_twins_predicted_alike_the_one_that_stores_long_rows_takes_the_place():
    # 2050 x 2112: 192x176 tiles make a 11 x 12 grid either way round, predicted alike; the
    # unswapped binary stores rows of 32 bytes, the swapped one columns of 192 rows
    p = problem(2050, 2112, 2000, linear=True)
    model = RankingModel(DeviceModel())
    wide = GemmConfig(tile_m=192, tile_n=176)
    assert model.predict_us(p, wide) == model.predict_us(p, dataclasses.replace(wide, swap_ab=True))
    top = model.top_k(p, candidates(p, orders=False), 8)
    swaps = {c.swap_ab for c in top if (c.tile_m, c.tile_n) == (192, 176)}
    assert swaps == {True}  # the tile's place went to a swapped binary
    # where the output is M-major the unswapped binary stores the long rows and keeps its place
    m_major = dataclasses.replace(p, out_major="m")
    top = model.top_k(m_major, candidates(m_major, orders=False), 8)
    assert not any(shortlist.short_store_rows(c, m_major) and c.tile_n == 176 for c in top)


def test_odd_eight_widths_are_ranked_swapped_where_they_fit_a_few_hundred_rows():
    """cuBLASLt's tiles on an H200: 777 rows as nine of 88, 300 as three of 104, 200 as one
    of 200; a width of 16 more would make as many tiles with more padding."""
    wide = GemmConfig(tile_m=256, tile_n=88, swap_ab=True)
    assert shortlist.fits_rows(wide, fp8_linear(777, 3584, 3584))
    assert shortlist.fits_rows(dataclasses.replace(wide, tile_n=104), fp8_linear(300, 9216, 3072))
    assert shortlist.fits_rows(dataclasses.replace(wide, tile_n=200), fp8_linear(200, 14336, 4096))
    # 208 rows: one tile of 208 fits them, a tile of 200 needs two
    assert not shortlist.fits_rows(
        dataclasses.replace(wide, tile_n=200), fp8_linear(208, 4096, 4096)
    )
    # 96 rows fit one tile of 96: 104 is no narrower for as many tiles
    assert not shortlist.fits_rows(
        dataclasses.replace(wide, tile_n=104), fp8_linear(96, 4096, 4096)
    )
    # 100 rows: two tiles of 56 hold fewer than two of 64; 512 rows: ten of 56 hold more than
    # eight of 64
    assert shortlist.fits_rows(dataclasses.replace(wide, tile_n=56), fp8_linear(100, 3584, 18944))
    assert not shortlist.fits_rows(dataclasses.replace(wide, tile_n=56), fp8_linear(512, 512, 512))
    # unswapped, or on more rows than `ODD_EIGHT_MAX_ROWS`: not ranked
    assert not shortlist.fits_rows(
        dataclasses.replace(wide, swap_ab=False), fp8_linear(777, 3584, 3584)
    )
    assert not shortlist.fits_rows(wide, fp8_linear(4096, 3584, 3584))
    # widths of an even number of blocks are ranked everywhere
    assert shortlist.fits_rows(
        dataclasses.replace(wide, tile_n=96, swap_ab=False), fp8_linear(4096, 4096, 4096)
    )
    model = RankingModel()
    p = fp8_linear(777, 3584, 3584)
    top = model.top_k(p, candidates(p, orders=False), 8)
    assert any(c.tile_n in ODD_EIGHT_TILE_NS for c in top)
    p = fp8_linear(2048, 2048, 2048)
    top = model.top_k(p, candidates(p, orders=False), 8)
    assert not any(c.tile_n in ODD_EIGHT_TILE_NS for c in top)


def test_one_wave_data_parallel_configs_of_compute_bound_problems_start_in_plain_order():
    model = RankingModel()
    ragged = problem(777, 3584, 3584, linear=True)
    one_wave = GemmConfig(
        tile_m=256, tile_n=88, cluster_m=2, schedule="cooperative", swap_ab=True
    )  # 14 x 9 tiles in 63 clusters of two
    assert not model.memory_bound(ragged) and model.one_wave(ragged, one_wave)
    first = model.first_order(ragged, one_wave)
    assert (first.raster, first.swizzle) == (Raster.ALONG_M, 1)
    assert first.compile_key == one_wave.compile_key
    # many waves of tiles, a split-K unit's splits, a memory-bound problem: bands of 8
    large = problem(8192, 8192, 8192)
    many = GemmConfig(tile_m=128, tile_n=256, cluster_m=2, schedule="cooperative")
    split = dataclasses.replace(
        GemmConfig(tile_m=128, tile_n=128, cluster_m=2, schedule="cooperative"),
        decomposition=Decomposition.SPLIT_K,
        splits=8,
    )
    small_mn = problem(512, 512, 32768)
    decode = problem(16, 8192, 8192, linear=True)
    narrow = GemmConfig(tile_m=128, tile_n=16, schedule="pingpong", swap_ab=True)
    assert model.one_wave(small_mn, split) and model.one_wave(decode, narrow)
    assert model.memory_bound(decode)
    for p, c in ((large, many), (small_mn, split), (decode, narrow)):
        assert model.first_order(p, c) == in_first_order(c)
    assert (in_first_order(many).raster, in_first_order(many).swizzle) == (FIRST_RASTER, 8)
