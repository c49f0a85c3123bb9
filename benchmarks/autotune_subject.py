"""A user's function under `@gemmtune.autotune`, importable by the benchmark worker: three
configs of a sub-millisecond product (the matrix split in 1, 2 or 4 row blocks)."""

import torch

import gemmtune


def reference(x: torch.Tensor, w: torch.Tensor, *, config=None) -> torch.Tensor:
    return x.float() @ w.float()


@gemmtune.autotune(
    configs=[{"chunks": 1}, {"chunks": 2}, {"chunks": 4}], key=["x", "w"], reference=reference
)
def chunked_matmul(x: torch.Tensor, w: torch.Tensor, *, config) -> torch.Tensor:
    return torch.cat([part @ w for part in x.chunk(config["chunks"])])
