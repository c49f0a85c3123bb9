"""The profiling launcher's command line on a CPU: what it accepts before it touches a GPU."""

import argparse

import pytest
from benchmarks.profile_launches import main, parse_shape


def test_a_shape_is_m_by_n_by_k():
    assert parse_shape("512x512x32768") == (512, 512, 32768)
    assert parse_shape("16X6144X4096") == (16, 6144, 4096)
    for bad in ("512x512", "axbxc", "1x2x3x4"):
        with pytest.raises(argparse.ArgumentTypeError, match="MxNxK"):
            parse_shape(bad)


def test_a_bad_shape_or_dtype_stops_at_the_command_line(capsys):
    for argv in (["512x512", "sm90_128x128_c1x1_coop_tma_dp"], ["1x2x3", "k", "--dtype", "fp8"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
    assert "invalid" in capsys.readouterr().err
