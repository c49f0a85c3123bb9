"""Pre-tune a model's GEMMs ahead of serving, and export the table to ship with the model.

    python examples/pretune_model_shapes.py [--out llama8b-h200.json] [--batch-sizes 1 16 128]

On the serving machine (the same GPU model):  gemmtune cache import llama8b-h200.json
then GEMMTUNE_MODE=cache-only, so serving never tunes. With a model object at hand,
`gemmtune.pretune(model)` reads the same shapes from its linear layers' weights.
"""

import argparse
import logging

import torch

import gemmtune
from gemmtune.api.pretune import shapes_from_config

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="pretuned-gemms.json", help="where to export the table")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 128, 4096])
    args = parser.parse_args()
    shapes = shapes_from_config(LLAMA3_8B)
    table = gemmtune.pretune(shapes=shapes, batch_sizes=args.batch_sizes, dtype=torch.bfloat16)
    for row in table.rows:
        m, n, k, _ = row.shape
        print(f"{m:5d}x{n}x{k}: {row.config} ({row.source})")
    print(f"exported {table.export(args.out)} tuned buckets to {args.out}")


if __name__ == "__main__":
    main()
