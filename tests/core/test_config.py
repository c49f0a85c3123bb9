import json

import pytest

from gemmtune.core.config import Decomposition, GemmConfig, InvalidConfigError, Raster, Schedule


def test_defaults_are_valid_and_keyed():
    cfg = GemmConfig()
    assert cfg.key == "sm90_128x128_c1x1_coop_tma_dp_rm_s1"
    assert cfg.compile_key == "sm90_128x128_c1x1_coop_tma_dp"


CONFIGS = [
    GemmConfig(),
    GemmConfig(tile_m=64, tile_n=256, cluster_m=2, schedule="pingpong", tma_store=False),
    GemmConfig(tile_n=192, decomposition="split_k", splits=4, raster="along_n", swizzle=8),
    GemmConfig(tile_m=256, tile_n=128, cluster_m=2, cluster_n=2, decomposition="stream_k"),
    GemmConfig(tile_m=256, tile_n=208, cluster_n=2, swap_ab=True, raster="along_n", swizzle=8),
    GemmConfig(tile_n=64, swap_ab=True, decomposition="split_k", splits=3),
    GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True, stage_k_bytes=256),
    GemmConfig(arch="sm_100", tile_m=256, tile_n=224, cluster_m=4, two_cta=True),
    GemmConfig(arch="sm_100", tile_m=64, tile_n=32, cluster_n=16),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_json_round_trip(cfg):
    text = cfg.to_json()
    assert json.loads(text)["decomposition"] == cfg.decomposition.value
    back = GemmConfig.from_json(text)
    assert back == cfg
    assert hash(back) == hash(cfg)
    assert back.key == cfg.key


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_key_round_trip(cfg):
    assert GemmConfig.from_key(cfg.key) == cfg


def test_keys_are_distinct_and_compile_key_ignores_runtime_fields():
    keys = {c.key for c in CONFIGS}
    assert len(keys) == len(CONFIGS)
    base = GemmConfig()
    other = base.with_runtime(raster="along_n", swizzle=4)
    assert other.raster is Raster.ALONG_N and other.swizzle == 4
    assert other.compile_key == base.compile_key
    assert other.key != base.key
    split = GemmConfig(decomposition="split_k", splits=2)
    assert split.with_runtime(splits=8).compile_key == split.compile_key
    assert split.with_runtime(splits=8).key == split.key.replace("_sk2_", "_sk8_")


@pytest.mark.parametrize(
    "runtime, field",
    [
        (dict(splits=17), "splits"),
        (dict(splits=1), "splits"),
        (dict(splits=True), "splits"),
        (dict(swizzle=3), "swizzle"),
        (dict(raster="diagonal"), "raster"),
    ],
)
def test_runtime_variants_are_checked_and_leave_their_binary_alone(runtime, field):
    split = GemmConfig(decomposition="split_k", splits=2)
    with pytest.raises(InvalidConfigError, match=field):
        split.with_runtime(**runtime)
    with pytest.raises(InvalidConfigError, match="splits"):
        GemmConfig().with_runtime(splits=4)  # data-parallel: no split count
    variant = split.with_runtime(splits=8, raster="along_n", swizzle=2)
    assert (split.splits, split.raster, split.swizzle) == (2, Raster.ALONG_M, 1)
    # a variant is the config its key names: equal, same hash
    assert variant == GemmConfig.from_key(variant.key)
    assert hash(variant) == hash(GemmConfig.from_key(variant.key))


def test_a_wide_stage_names_a_binary_of_its_own_and_the_default_keeps_its_key():
    narrow = GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True)
    wide = GemmConfig(tile_m=64, tile_n=16, schedule="pingpong", swap_ab=True, stage_k_bytes=256)
    assert narrow.key == "sm90_64x16_c1x1_swap_pp_tma_dp_rm_s1"
    assert wide.key == "sm90_64x16_c1x1_swap_pp_tma_k256_dp_rm_s1"
    assert wide.compile_key != narrow.compile_key
    assert GemmConfig.from_key(narrow.key).stage_k_bytes == 128


def test_swap_names_a_binary_of_its_own():
    swapped = GemmConfig(tile_m=256, tile_n=208, cluster_n=2, swap_ab=True, swizzle=8)
    assert swapped.key == "sm90_256x208_c1x2_swap_coop_tma_dp_rm_s8"
    assert swapped.compile_key == "sm90_256x208_c1x2_swap_coop_tma_dp"
    split = GemmConfig(swap_ab=True, decomposition="split_k", splits=4)
    assert split.key == "sm90_128x128_c1x1_swap_coop_tma_sk4_rm_s1"
    with pytest.raises(InvalidConfigError, match="swap_ab"):
        GemmConfig(swap_ab=1)


def test_strings_become_enums_and_config_is_frozen():
    cfg = GemmConfig(decomposition="stream_k", raster="along_n", schedule="pingpong")
    assert cfg.decomposition is Decomposition.STREAM_K
    assert cfg.schedule is Schedule.PINGPONG
    with pytest.raises(AttributeError):
        cfg.tile_m = 64  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "field", "why"),
    [
        ({"arch": "sm_80"}, "arch", "must be one of"),
        ({"tile_m": 96}, "tile_m", "one of (64, 128, 192, 256)"),
        ({"tile_m": 512}, "tile_m", "one of (64, 128, 192, 256)"),
        ({"arch": "sm_100", "tile_m": 192}, "tile_m", "M of 64 or 128"),
        (
            {"arch": "sm_100", "two_cta": True, "cluster_m": 2, "tile_m": 192},
            "tile_m",
            "128 or 256",
        ),
        ({"tile_n": 100}, "tile_n", "multiple of 8"),
        ({"tile_n": 264}, "tile_n", "multiple of 8"),
        ({"tile_n": 0}, "tile_n", "multiple of 8"),
        ({"cluster_m": 3}, "cluster_m", "power of two"),
        ({"cluster_n": 0}, "cluster_n", "power of two"),
        ({"cluster_m": 4, "cluster_n": 8}, "cluster_n", "at most 16"),
        ({"two_cta": True}, "two_cta", "sm_100 only"),
        ({"arch": "sm_100", "two_cta": True, "cluster_m": 1}, "cluster_m", "even"),
        ({"arch": "sm_100", "two_cta": True, "cluster_m": 2, "tile_m": 64}, "tile_m", "128 or 256"),
        ({"arch": "sm_100", "tile_m": 256}, "tile_m", "needs two_cta"),
        ({"decomposition": "split_k", "splits": 1}, "splits", "2 to 16"),
        ({"decomposition": "split_k", "splits": 17}, "splits", "2 to 16"),
        ({"splits": 4}, "splits", "only split-K"),
        ({"decomposition": "stream_k", "splits": 2}, "splits", "only split-K"),
        ({"decomposition": "tiled"}, "decomposition", "not one of"),
        ({"raster": "diagonal"}, "raster", "not one of"),
        ({"schedule": "serial"}, "schedule", "not one of"),
        ({"arch": "sm_100", "schedule": "pingpong"}, "schedule", "Hopper"),
        ({"swizzle": 3}, "swizzle", "one of"),
        ({"tile_m": 128.0}, "tile_m", "integer"),
        ({"tile_m": True}, "tile_m", "integer"),
        ({"tma_store": 1}, "tma_store", "bool"),
        ({"stage_k_bytes": 192}, "stage_k_bytes", "one of (128, 256)"),
        ({"stage_k_bytes": 256.0}, "stage_k_bytes", "integer"),
    ],
)
def test_invalid_fields_say_why(fields, field, why):
    with pytest.raises(InvalidConfigError, match=field) as info:
        GemmConfig(**fields)
    assert why in str(info.value)


def test_from_dict_rejects_unknown_fields():
    data = GemmConfig().to_dict()
    data["warps"] = 8
    with pytest.raises(InvalidConfigError, match="warps"):
        GemmConfig.from_dict(data)


@pytest.mark.parametrize("key", ["", "sm90_128x128", "sm90_128x128_c1x1_tma_dp_rq_s1", "x" * 5])
def test_from_key_rejects_garbage(key):
    with pytest.raises(InvalidConfigError):
        GemmConfig.from_key(key)
