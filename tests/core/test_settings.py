from pathlib import Path

from gemmtune.core.settings import cache_dir


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("GEMMTUNE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "gemmtune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "gemmtune"
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
