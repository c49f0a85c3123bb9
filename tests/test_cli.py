import json

import pytest

from gemmtune.cache.results import ResultsCache, TunedRecord
from gemmtune.cli import main


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "doctor" in capsys.readouterr().out


def test_doctor_json(capsys, cache_dir):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cache_dir"] == str(cache_dir) and report["dsl"]["nvidia_cutlass_dsl"]


def test_cache_show_export_import_clear(capsys, cache_dir, tmp_path):
    ResultsCache().store(
        "m128_n128_k128_2d|x", TunedRecord("sm90_128x128_c1x1_coop_tma_dp_rm_s1", 0.01)
    )
    assert main(["cache", "show"]) == 0
    out = capsys.readouterr().out
    assert "sm90_128x128_c1x1_coop_tma_dp_rm_s1" in out and "1 results" in out
    assert main(["cache", "export", str(tmp_path / "t.json")]) == 0
    assert main(["cache", "clear"]) == 0
    assert "cleared 1" in capsys.readouterr().out.splitlines()[-1]
    assert main(["cache", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["cache", "import", str(tmp_path / "t.json")]) == 0
    assert ResultsCache().lookup("m128_n128_k128_2d|x").ms == 0.01


def test_export_needs_a_file(cache_dir):
    with pytest.raises(SystemExit):
        main(["cache", "export"])
