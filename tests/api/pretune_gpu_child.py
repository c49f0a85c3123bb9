"""One rank of `torchrun --nproc-per-node 2 pretune_gpu_child.py FOLDER` (`test_pretune_gpu.py`):
a cache of its own (FOLDER/rankN), its GPU, `gemmtune.pretune` of 16 buckets; it writes the
records its cache ends with and the buckets it tuned to FOLDER/rankN.json."""

import json
import os
import sys
from pathlib import Path

folder = Path(sys.argv[1])
rank = int(os.environ["RANK"])
os.environ["GEMMTUNE_CACHE_DIR"] = str(folder / f"rank{rank}")

import torch  # noqa: E402  the cache folder is chosen first
import torch.distributed as dist  # noqa: E402

import gemmtune  # noqa: E402
from gemmtune.api.pretune import LinearShape  # noqa: E402

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group()
shapes = [LinearShape("o", 4096, 4096), LinearShape("qkv", 6144, 4096)]
outcome = gemmtune.pretune(shapes=shapes, batch_sizes=[1, 2, 4, 8, 16, 32, 64, 128], progress=False)
dist.destroy_process_group()
report = {
    "records": {row.key: row.record.to_json() for row in outcome.rows if row.record},
    "tuned": [row.key for row in outcome.rows if row.source == "tuned"],
    "wall_s": outcome.wall_s,
}
(folder / f"rank{rank}.json").write_text(json.dumps(report))
