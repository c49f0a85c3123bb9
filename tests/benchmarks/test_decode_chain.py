"""The decode-chain suite's choices on a CPU: which rows of a serving results file it runs, how
many layers a stack holds, and the operands it builds for each layout."""

import gzip
import json

import pytest
import torch
from benchmarks.decode_chain import decode_rows, layer_count, stack

DECODE_CONFIG = "sm90_64x16_c1x1_swap_pp_tma_k256_dp_rm_s8"


def row(shape, m, dtype="bf16", contender="kernels", layout="tt", config=DECODE_CONFIG):
    return {
        "shape": shape, "m": m, "n": 4096, "k": 4096, "dtype": dtype, "layout": layout,
        "config": config, "suite": "serving", "contender": contender,
    }  # fmt: skip


def test_it_takes_the_16_bit_and_e4m3_decode_rows_of_our_kernels_alone_from_a_gzipped_file(
    tmp_path,
):
    rows = [
        row("l8b_o_m16", 16),
        row("l8b_o_m64", 64, dtype="fp16", layout="tn"),
        row("l8b_o_m128", 128),  # beyond --max-m
        row("l8b_o_m8", 8, contender="tuned_gemm"),
        row("l8b_o_m4", 4, dtype="e4m3"),
        row("l8b_o_m1", 1, dtype="int8"),
        row("l8b_o_m2", 2, config=None),  # a row whose tune kept no config of ours
    ]
    path = tmp_path / "serving-h200-2026-01-01.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"rows": rows}).encode()))
    assert [r["shape"] for r in decode_rows(path, 64)] == ["l8b_o_m16", "l8b_o_m64", "l8b_o_m4"]
    assert [r["shape"] for r in decode_rows(path, 8)] == ["l8b_o_m4"]


def test_a_stack_fills_four_l2s_and_holds_at_least_two_layers():
    l2 = 60 * 2**20
    assert layer_count(4096 * 4096 * 2, l2) == 8  # the 8B o projection: 33.5 MB
    assert layer_count(8192 * 57344 * 2, l2) == 2  # the 70B gate-up: 940 MB
    assert layer_count(4 * l2, l2) == 2 and layer_count(4 * l2 - 1, l2) == 2
    assert layer_count(l2, l2) == 4


@pytest.mark.parametrize("layout", ["tt", "tn"])
def test_each_layer_has_its_own_weight_read_as_the_layout_says(layout):
    r = {**row("custom", 3, layout=layout), "n": 40, "k": 24}
    x, weights, bs = stack(r, 3, "cpu")
    assert x.shape == (3, 24) and len(weights) == len(bs) == 3
    assert all(b.shape == (24, 40) for b in bs)
    assert weights[0].shape == ((40, 24) if layout == "tt" else (24, 40))
    assert (bs[0].stride(0) == 1) == (layout == "tt")  # "tt": b = w.t(), K-major
    assert not torch.equal(weights[0], weights[1])
    for w, b in zip(weights, bs, strict=True):  # each layer's b is a view of its own weight
        assert b.data_ptr() == w.data_ptr() and torch.equal(b, w.t() if layout == "tt" else w)


def test_a_layout_no_linear_layer_gives_is_refused():
    with pytest.raises(ValueError, match="layout"):
        stack(row("custom", 1, layout="nn"), 1, "cpu")


def test_an_fp8_stack_holds_fp8_operands_rounded_from_randn():
    r = {**row("custom", 2, dtype="e4m3"), "n": 48, "k": 32}
    x, weights, bs = stack(r, 2, "cpu")
    assert x.dtype == weights[0].dtype == bs[0].dtype == torch.float8_e4m3fn
    assert bs[0].shape == (32, 48) and bs[0].stride(0) == 1
    values = weights[0].float()
    assert values.std() > 0.5 and not torch.equal(values, values.round())  # not small integers
