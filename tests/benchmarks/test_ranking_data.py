"""The tools that make the ranking model's data: which timings a re-timing run replaces, and
which families the fit takes (CPU only)."""

from benchmarks.fit_ranking import fit_families, problem_of
from benchmarks.timings import rows_kept

from gemmtune.core.config import GemmConfig
from gemmtune.space.ranking import DeviceModel, family


def test_a_merge_replaces_the_rows_of_every_binary_it_re_times():
    rows = [
        {"config": "sm90_128x128_c1x1_coop_tma_dp_rm_s1"},
        {"config": "sm90_128x128_c1x1_coop_tma_dp_rn_s8"},
        {"config": "sm90_128x128_c1x1_coop_tma_sk4_rm_s1"},
        {"config": "sm90_128x128_c1x1_coop_tma_streamk_rm_s1"},
    ]
    # `_dp$` names every data-parallel binary, whatever the row's raster and swizzle
    kept = rows_kept(rows, "_dp$")
    assert [r["config"] for r in kept] == [
        "sm90_128x128_c1x1_coop_tma_sk4_rm_s1",
        "sm90_128x128_c1x1_coop_tma_streamk_rm_s1",
    ]
    assert rows_kept(rows, "_sk$") == [rows[0], rows[1], rows[3]]


def test_a_merge_on_named_shapes_keeps_every_row_of_the_others():
    rows = [
        {"shape": "sq8192", "config": "sm90_128x128_c1x1_coop_tma_dp_rm_s1"},
        {"shape": "sq8192", "config": "sm90_128x128_c1x1_coop_tma_sk4_rm_s1"},
        {"shape": "sq2048", "config": "sm90_128x128_c1x1_coop_tma_dp_rm_s1"},
    ]
    assert rows_kept(rows, "_dp$", {"sq8192"}) == rows[1:]
    assert rows_kept(rows, "", {"sq8192"}) == rows[2:]


def test_the_fit_leaves_narrow_tiles_to_the_analytic_estimate():
    wide = GemmConfig(tile_m=128, tile_n=128)
    narrow = GemmConfig(tile_m=128, tile_n=32)
    data = {
        ("a", 4096, 4096, 4096): [(wide, 200.0), (narrow, 700.0)],
        ("b", 2048, 2048, 2048): [(wide, 30.0), (narrow, 90.0)],
    }
    families = fit_families(data, DeviceModel())
    assert set(families) == {family(wide)}
    a, c = families[family(wide)]
    assert a > 0 and c >= 0


def test_an_8bit_fit_counts_k_tiles_of_128_elements():
    wide = GemmConfig(tile_m=128, tile_n=128)
    # one wave each (16 and 64 tiles): times 2 + 0.25 per k-tile of 128 elements
    data = {
        ("a", 512, 512, 8192): [(wide, 2 + 0.25 * 64)],
        ("b", 1024, 1024, 4096): [(wide, 2 + 0.25 * 32)],
    }
    a, c = fit_families(data, DeviceModel(), ab_bytes=1)[family(wide)]
    assert (a, c) == (0.25, 2.0)
    a16, _ = fit_families(data, DeviceModel())[family(wide)]
    assert a16 == 0.125


def test_8bit_timings_are_replayed_on_the_problem_they_timed():
    problem = problem_of(128, 6144, 4096, "e4m3")
    assert (problem.a_major, problem.b_major) == ("k", "k")
    assert problem.a_dtype.itemsize == 1 and problem.scaling == "tensor"
    assert problem_of(64, 64, 64).b_major == "n"
