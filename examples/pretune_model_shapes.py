"""Pre-tune a model's GEMM shapes ahead of serving, and export the table to ship with the model.

    python examples/pretune_model_shapes.py [--out llama8b-h200.json] [--tokens 128 4096]

On the serving machine (the same GPU model):  gemmtune cache import llama8b-h200.json
then GEMMTUNE_MODE=cache-only, so serving never tunes.
"""

import argparse
import logging

import torch

from gemmtune.api.dispatch import DISPATCHER
from gemmtune.core.problem import GemmProblem

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

# Llama-3-8B projections as (n, k): activations (tokens x k) times a K-major weight view
LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="pretuned-gemms.json", help="where to export the table")
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 4096])
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    args = parser.parse_args()
    for tokens in args.tokens:
        for name in args.layers:
            n, k = LAYERS[name]
            # torch.nn.functional.linear(x, w) is x @ w.t(): B is K-major ("tt" with a row-major x)
            problem = GemmProblem.of_shape(tokens, n, k, dtype=torch.bfloat16, layout="tt")
            result = DISPATCHER.tune(problem)
            winner = result.best.key if result.backend == "gemmtune" else "torch.matmul"
            tflops = result.best_tflops or 0
            print(f"{name:8s} {tokens:5d}x{n}x{k}: {winner} (ours: {tflops:.0f} TFLOP/s)")
    count = DISPATCHER.chooser.results_cache().export(args.out)
    print(f"exported {count} tuned buckets to {args.out}")


if __name__ == "__main__":
    main()
