"""The kernel cache on the CPU: kernels compile for sm_90a here, and load (the GPU module is
only loaded at the first launch)."""

import subprocess
import sys

import pytest

from gemmtune.cache.kernels import KernelCache, fingerprint
from gemmtune.core.config import GemmConfig
from gemmtune.kernels.build import artifact_name, artifact_suffix
from gemmtune.kernels.signature import KernelSignature

pytestmark = [pytest.mark.compile, pytest.mark.timeout(300)]

CONFIG = GemmConfig(tile_m=128, tile_n=128)
SIGNATURE = KernelSignature()


def test_compiled_once_then_loaded_by_a_fresh_cache(tmp_path):
    first = KernelCache("sm_90a", tmp_path)
    kernel = first.get(CONFIG, SIGNATURE)
    assert first.compiles == 1 and first.get(CONFIG, SIGNATURE) is kernel
    path = first.path(CONFIG, SIGNATURE)
    assert path.name == artifact_name(CONFIG, SIGNATURE) and path.stat().st_size > 1000
    assert [p.name for p in path.parent.iterdir() if ".tmp" in p.name] == []
    # another process: same folder, nothing in memory
    second = KernelCache("sm_90a", tmp_path)
    assert second.get(CONFIG, SIGNATURE) is not None
    assert (second.loads, second.compiles) == (1, 0)
    # the same config at other runtime arguments is the same binary
    assert second.get(CONFIG.with_runtime(swizzle=4), SIGNATURE) is second.get(CONFIG, SIGNATURE)


def test_a_corrupt_kernel_file_is_set_aside_and_rebuilt(tmp_path, caplog):
    cache = KernelCache("sm_90a", tmp_path)
    path = cache.path(CONFIG, SIGNATURE)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF truncated")
    assert cache.get(CONFIG, SIGNATURE) is not None
    assert cache.compiles == 1 and "cannot be loaded" in caplog.text
    assert any(".corrupt-" in p.name for p in path.parent.iterdir())
    assert KernelCache("sm_90a", tmp_path).get(CONFIG, SIGNATURE) is not None


@pytest.mark.skipif(artifact_suffix() != ".so", reason="no C compiler to link kernels with")
def test_kernels_are_shared_libraries_that_load_without_the_dsl(tmp_path):
    """Where a C compiler links them (CI has one), a fresh process loads kernels through
    TVM-FFI alone: importing the DSL would cost the first call about a second."""
    KernelCache("sm_90a", tmp_path).get(CONFIG, SIGNATURE)
    code = (
        "import sys; from pathlib import Path; from gemmtune.cache.kernels import KernelCache;"
        "from gemmtune.core.config import GemmConfig; from gemmtune.kernels.signature import "
        "KernelSignature; c = KernelCache('sm_90a', Path(sys.argv[1]));"
        "c.get(GemmConfig(tile_m=128, tile_n=128), KernelSignature());"
        "print(c.loads, c.compiles, 'cutlass' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "0", "False"]
    assert KernelCache("sm_90a", tmp_path).path(CONFIG, SIGNATURE).suffix == ".so"


def test_the_folder_changes_with_what_changes_a_binary(tmp_path, monkeypatch):
    """The target, gemmtune's version, the DSL's and any source file of `kernels/`."""
    from gemmtune.cache import kernels as module

    assert fingerprint("sm_90a") != fingerprint("sm_100a")
    assert KernelCache("sm_90a").folder.name.startswith("sm_90a-")
    sources = tmp_path / "gemmtune" / "kernels"
    (sources / "sm90").mkdir(parents=True)
    (sources / "sm90" / "mainloop.py").write_text("STAGES = 4\n")
    monkeypatch.setattr(module, "__file__", str(tmp_path / "gemmtune" / "cache" / "kernels.py"))

    def fresh() -> str:
        fingerprint.cache_clear()
        return fingerprint("sm_90a")

    try:  # the cached fingerprints of the fake sources must not outlive the test
        seen = [fresh()]
        (sources / "sm90" / "mainloop.py").write_text("STAGES = 5\n")
        seen.append(fresh())
        monkeypatch.setattr(module, "gemmtune_version", lambda: "9.9.9")
        seen.append(fresh())
        monkeypatch.setattr(module, "package_version", lambda dist: "0.0.1")
        seen.append(fresh())
        assert len(set(seen)) == 4 and fresh() == seen[-1]
    finally:
        monkeypatch.undo()
        fingerprint.cache_clear()


def test_the_compile_workers_fill_the_kernel_cache_and_reuse_it(tmp_path):
    from gemmtune import workers
    from gemmtune.workers.compiler import CompileJob, compile_all

    cache = KernelCache("sm_90a", tmp_path)
    pool = workers.compile_pool("sm_90a")
    (outcome,) = compile_all([CompileJob(CONFIG, SIGNATURE)], cache.folder, pool)
    assert outcome.path == cache.path(CONFIG, SIGNATURE) and not outcome.cached
    assert cache.get(CONFIG, SIGNATURE) is not None
    assert (cache.loads, cache.compiles) == (1, 0)
    # what the cache holds is never compiled again
    (again,) = compile_all([CompileJob(CONFIG, SIGNATURE)], cache.folder, pool)
    assert again.cached and again.compile_s == 0 and again.path == outcome.path
