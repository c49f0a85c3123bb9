"""The device facts kept on disk: queried once per GPU model, then read by every process."""

import json

import pytest

from gemmtune.core import device
from gemmtune.core.device import DeviceInfo


def test_max_active_clusters_is_queried_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_CACHE_DIR", str(tmp_path))
    info = DeviceInfo(0, "NVIDIA H200", (9, 0), 132, 60 << 20, 141 << 30)
    monkeypatch.setattr(device, "device_info", lambda index: info)
    queries = []
    monkeypatch.setattr(
        device,
        "_query_max_active_clusters",
        lambda size, index: queries.append(size) or 132 // size,
    )
    device.max_active_clusters.cache_clear()
    assert device.max_active_clusters(1, 0) == 132 and device.max_active_clusters(2, 0) == 66
    facts = json.loads((tmp_path / device.FACTS_FILE).read_text())
    assert facts == {"NVIDIA H200|132|1": 132, "NVIDIA H200|132|2": 66}
    device.max_active_clusters.cache_clear()  # a new process
    assert device.max_active_clusters(2, 0) == 66 and queries == [1, 2]
    device.max_active_clusters.cache_clear()


@pytest.mark.gpu
def test_the_driver_query_agrees_with_the_dsl():
    """Our occupancy query (an empty PTX kernel, no compiler) against the DSL's helper."""
    import cutlass.utils
    import torch

    torch.cuda.current_stream().synchronize()  # torch's context is the one the DSL's helper needs
    hardware = cutlass.utils.HardwareInfo()
    for size in (1, 2, 4, 8):
        expected = hardware.get_max_active_clusters(size)
        assert device._query_max_active_clusters(size, 0) == expected > 0
