"""Hypothesis strategies shared by the scheduler tests (`test_schedule_model.py`,
`test_scheduler_mirror.py`)."""

from hypothesis import strategies as st

from gemmtune.kernels.schedule_model import TileGrid

#: problems and tilings: every tile size and cluster shape the Hopper kernel has, ragged edges,
#: up to three batches
grids = st.builds(
    TileGrid,
    m=st.integers(1, 4096),
    n=st.integers(1, 4096),
    l=st.integers(1, 3),
    tile_m=st.sampled_from([64, 128, 192, 256]),
    tile_n=st.sampled_from([64, 128, 192, 256]),
    cluster_m=st.sampled_from([1, 2]),
    cluster_n=st.sampled_from([1, 2]),
)
