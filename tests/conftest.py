"""Test-session setup shared by every test.

The session's cache directory is a fresh temporary folder (the helper processes it starts
inherit it).

GPU tests carry `@pytest.mark.gpu` and are skipped, with the reason, where torch sees no GPU.
On such a machine kernels still compile: the DSL is pointed at sm_90a before anything imports
`cutlass` (tests that need another target compile in a subprocess).
"""

import os
import tempfile

import pytest
import torch

HAS_GPU = torch.cuda.is_available() and torch.cuda.device_count() > 0

# Tests never read or write the user's cache; a test that needs an empty one makes its own.
os.environ["GEMMTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="gemmtune-test-cache-")

if not HAS_GPU:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(
        reason="needs an NVIDIA GPU (none visible to torch); run on the GPU machine"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def inductor_post_pass():
    """Inductor's config with its post-grad pass slot empty, restored after the test.

    torch's own `config.patch` restores it (whatever the test assigns meanwhile): pytest's
    monkeypatch deletes a module attribute it did not find in the module's `__dict__`, and
    Inductor's config keeps its values elsewhere.
    """
    import torch._inductor.config as config

    with config.patch(post_grad_custom_post_pass=None):
        yield config
