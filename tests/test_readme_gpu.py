"""Every Python snippet of the README runs, as a user's script would (no main guard)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gemmtune.cache.results import ResultsCache

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(tmp_path, index):
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(SNIPPETS[index])
    env = dict(os.environ, GEMMTUNE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CUTE_DSL_ARCH", None)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=800,
        env=env,
        cwd=tmp_path,  # what a snippet writes stays out of the checkout
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "found no working kernel" not in done.stderr
    # whatever the snippet tuned was stored: tuning worked from an unguarded script
    if "tuned_gemm(a, b)" in SNIPPETS[index]:
        assert ResultsCache(tmp_path / "cache" / "results.sqlite").items()
