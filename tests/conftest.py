"""Test-session setup shared by every test.

GPU tests carry `@pytest.mark.gpu` and are skipped, with the reason, where torch sees no GPU.
On such a machine kernels still compile: the DSL is pointed at sm_90a before anything imports
`cutlass` (tests that need another target compile in a subprocess).
"""

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available() and torch.cuda.device_count() > 0

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
