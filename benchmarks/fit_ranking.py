"""Fit the ranking model's constants to exhaustive timings, and measure how well it ranks.

Reads `results/timings-<gpu>-<date>.json.gz` (`python -m benchmarks timings`), fits each
family's (µs per k-tile, µs per item) by weighted least squares on its data-parallel timings,
picks the split-K wait, compute/memory overlap penalty and HBM re-read fraction of operands
shared between clusters that rank best (the partial-tile costs are set: `SPLIT_K_COSTS`,
`STREAM_K_COSTS`), and writes `src/gemmtune/space/calibration_sm_90.json`. Timings of 8-bit
inputs (`timings --dtype e4m3`) refit the families of 8-bit problems only (`families_8bit`)
and keep everything else. Then, shape by shape, replays the tuner on the measured data: the
model's top k configs, the runtime sweep (raster x swizzle) of the best two, against the
exhaustive best; each shape is also replayed with its own timings left out of the fit
(leave-one-shape-out), the honest figure for shapes the model has not seen. The table goes to
`ranking[-<dtype>]-<gpu>-<date>.json`.

A CPU tool, not a suite:

    python -m benchmarks.fit_ranking benchmarks/results/timings-h200-2026-11-22.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, gpu_tag
from gemmtune.core.config import Decomposition, GemmConfig, Raster
from gemmtune.core.device import Arch
from gemmtune.core.dtypes import EIGHT_BIT, torch_dtype
from gemmtune.core.problem import GemmProblem
from gemmtune.kernels import tile_k
from gemmtune.kernels.schedule_model import TileGrid, ceil_div
from gemmtune.kernels.sm90.rules import FITTED_MIN_TILE_N
from gemmtune.space.ranking import DeviceModel, RankingModel, family

CALIBRATION = Path(__file__).resolve().parents[1] / "src/gemmtune/space/calibration_sm_90.json"
RUNTIME_SWEPT = 2
# Split-K's partial-tile costs, set rather than fitted: each split writes its partial tile and
# reads a tile's worth back, at an SM's share of the L2 bandwidth (about 8 TB/s over 132 SMs:
# 60 GB/s, 0.016 us a KB). The partials stay in L2 (`RankingModel.predict_us`), so this, not
# the HBM floor, is what a larger tile's or a deeper split's reduction costs.
SPLIT_K_COSTS = {"publish_us_per_kb": 0.016, "gather_us_per_kb": 0.016}
SPLIT_K_WAITS = (0.0, 2.0, 4.0, 6.0, 8.0)
OVERLAP_PENALTIES = (0.2, 0.3, 0.5)
REREAD_FRACTIONS = (0.0, 0.15, 0.25, 0.5)
# Stream-K's partial-tile costs, measured rather than fitted: a globaltimer timeline of
# 128x128 and 128x256 stream-K launches on an H200 (thread 128 stamping each item's mainloop,
# reduction and epilogue) showed 2.3-2.6 us to publish a 64 KB partial, 3.5-4.2 us for 128 KB,
# and 1.0-1.3 us (64 KB) to 3.6-4.4 us (128 KB) for the owner to read and add one.
STREAM_K_COSTS = {"stream_k_publish_us_per_kb": 0.04, "stream_k_gather_us_per_kb": 0.02}


#: What a timings file of each input type timed (`benchmarks/timings.py`): the output's type
#: and the scaling of an fp8 product.
OUTPUTS = {"bf16": ("bf16", None), "e4m3": ("bf16", "tensor"), "int8": ("int32", None)}


def problem_of(m: int, n: int, k: int, dtype: str = "bf16") -> GemmProblem:
    """The problem a timings row measured: bf16 row-major, 8-bit a row-major and b K-major."""
    out_dtype, scaling = OUTPUTS[dtype]
    return GemmProblem.of_shape(
        m,
        n,
        k,
        dtype=torch_dtype(dtype),
        out_dtype=torch_dtype(out_dtype),
        layout="tt" if dtype in EIGHT_BIT else "tn",
        device="cuda:0",
        arch=Arch.SM90,
        scaling=scaling,
    )


def timed_dtype(doc: dict, path: Path) -> str:
    """The input type every row of the timings file `doc` (read from `path`) has."""
    found = {row["dtype"] for row in doc["rows"]}
    if len(found) != 1:
        raise SystemExit(f"{path}: rows of {sorted(found)}; fit one input type at a time")
    return found.pop()


def load(path: Path) -> dict[str, list[tuple[GemmConfig, float]]]:
    with gzip.open(path) as f:
        doc = json.load(f)
    by_shape = defaultdict(list)
    for row in doc["rows"]:
        if row["ours_ms"] is not None:
            config = GemmConfig.from_key(row["config"])
            by_shape[(row["shape"], row["m"], row["n"], row["k"])].append(
                (config, row["ours_ms"] * 1e3)
            )
    return by_shape


def fit_families(
    data: dict, device: DeviceModel, leave_out: str | None = None, ab_bytes: int = 2
) -> dict:
    """Per family, (a, c) minimising the relative error of waves * (a * k_tiles + c), for
    inputs of `ab_bytes` bytes. Narrow tiles (decode batches') are left to the model's
    analytic estimate: the suite's shapes are compute-bound, where they run many waves of
    little work and say nothing of a decode GEMM's streaming rate."""
    points = defaultdict(list)
    for (shape, m, n, k), timed in data.items():
        if shape == leave_out:
            continue
        for config, micros in timed:
            if (
                config.decomposition is not Decomposition.DATA_PARALLEL
                or config.raster is not Raster.ALONG_M
                or config.swizzle != 1
                or config.tile_n < FITTED_MIN_TILE_N
            ):
                continue
            grid = TileGrid.of(config, m, n, 1)
            resident = device.resident_clusters(config.cluster_m * config.cluster_n)
            waves = ceil_div(grid.work_units, resident)
            k_tiles = ceil_div(k, tile_k(config, ab_bytes))
            points[family(config)].append((waves * k_tiles, waves, micros))
    families = {}
    for name, rows in points.items():
        x = np.array([[r[0], r[1]] for r in rows], dtype=float)
        y = np.array([r[2] for r in rows], dtype=float)
        weights = 1 / y
        (a, c), *_ = np.linalg.lstsq(x * weights[:, None], y * weights, rcond=None)
        if c < 0:  # an item cannot take negative time: fit through the origin
            c = 0.0
            a = float(np.sum(x[:, 0] * y * weights**2) / np.sum((x[:, 0] * weights) ** 2))
        families[name] = [round(float(a), 6), round(float(c), 4)]
    return families


def replay(model: RankingModel, shape: tuple, timed: list, top_k: int, dtype: str = "bf16") -> dict:
    """The tuner's choice on measured data, against the exhaustive best."""
    _, m, n, k = shape
    problem = problem_of(m, n, k, dtype)
    measured = {c.key: t for c, t in timed}
    defaults = [c for c, _ in timed if c.raster is Raster.ALONG_M and c.swizzle == 1]
    picked = model.top_k(problem, defaults, top_k)
    times = sorted(((measured[c.key], c) for c in picked), key=lambda tc: tc[0])
    swept = [t for t, _ in times]
    for _, config in times[:RUNTIME_SWEPT]:
        for raster in Raster:
            for swizzle in (1, 2, 4, 8):
                variant = config.with_runtime(raster=raster, swizzle=swizzle)
                if variant.key in measured:
                    swept.append(measured[variant.key])
    best_tuned = min(swept)
    best = min(t for _, t in timed)
    return {
        "tuned_us": round(best_tuned, 3),
        "exhaustive_us": round(best, 3),
        "top_k_vs_exhaustive": round(best / best_tuned, 4),
        "top_k_binaries": [c.compile_key for c in picked],
    }


def fit_16_bit(data: dict, device: DeviceModel, top_k: int) -> dict:
    """The families fitted to 16-bit timings, with the split-K wait, overlap penalty and
    re-read fraction that rank best on them (the worst shape first, then the sum)."""
    families = fit_families(data, device)
    best = None
    for wait, penalty, reread in itertools.product(
        SPLIT_K_WAITS, OVERLAP_PENALTIES, REREAD_FRACTIONS
    ):
        calibration = {
            "families": families,
            **SPLIT_K_COSTS,
            "split_k_wait_us": wait,
            "overlap_penalty": penalty,
            "reread_fraction": reread,
            **STREAM_K_COSTS,
        }
        model = RankingModel(device, calibration)
        ratios = [replay(model, s, data[s], top_k)["top_k_vs_exhaustive"] for s in data]
        key = (min(ratios), sum(ratios))
        if best is None or key > best[0]:
            best = (key, calibration)
    return best[1]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fit_ranking", description=__doc__.splitlines()[0]
    )
    parser.add_argument("timings", type=Path)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    data = load(args.timings)
    with gzip.open(args.timings) as f:
        measured = json.load(f)  # where and when: the ranking file is named for it
    device = DeviceModel()
    dtype = timed_dtype(measured, args.timings)
    ab_bytes = torch_dtype(dtype).itemsize
    shipped = json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else {}
    if ab_bytes == 1:
        families_key = "families_8bit"
        calibration = dict(shipped, families_8bit=fit_families(data, device, ab_bytes=1))
        calibration["fitted_8bit_on"] = str(args.timings.name)
    else:
        families_key = "families"
        calibration = fit_16_bit(data, device, args.top_k)
        calibration["fitted_on"] = str(args.timings.name)
        calibration.update(
            {k: v for k, v in shipped.items() if k in ("families_8bit", "fitted_8bit_on")}
        )
    CALIBRATION.write_text(json.dumps(calibration, indent=0, sort_keys=True) + "\n")
    rows = []
    for shape in data:
        in_sample = replay(RankingModel(device, calibration), shape, data[shape], args.top_k, dtype)
        held_out = {
            **calibration,
            families_key: fit_families(data, device, leave_out=shape[0], ab_bytes=ab_bytes),
        }
        loo = replay(RankingModel(device, held_out), shape, data[shape], args.top_k, dtype)
        rows.append(
            {
                "shape": shape[0],
                "m": shape[1],
                "n": shape[2],
                "k": shape[3],
                "dtype": dtype,
                "top_k": args.top_k,
                "candidates_timed_exhaustively": len(data[shape]),
                **in_sample,
                "top_k_vs_exhaustive_leave_shape_out": loo["top_k_vs_exhaustive"],
            }
        )
        print(
            f"{shape[0]:>20}: top-{args.top_k} {in_sample['top_k_vs_exhaustive']:.3f} of the "
            f"exhaustive best ({loo['top_k_vs_exhaustive']:.3f} with the shape left out)"
        )
    doc = {
        "what": "tuning",
        "gpu": measured["gpu"],
        "sms": measured["sms"],
        "date": measured["date"],
        "method": (
            f"replayed on {args.timings.name}: the ranking model's top {args.top_k} configs at "
            f"default raster/swizzle, plus the raster x swizzle sweep of the best "
            f"{RUNTIME_SWEPT} (measured when the exhaustive data holds them), against the "
            "exhaustive best; the model's family constants are least-squares fits to the same "
            "data (also refitted without the shape: leave_shape_out)"
        ),
        "calibration": {k: v for k, v in calibration.items() if not k.startswith("families")},
        "rows": rows,
    }
    suffix = "" if dtype == "bf16" else f"-{dtype}"
    out = args.out_dir / f"ranking{suffix}-{gpu_tag(measured['gpu'])}-{measured['date']}.json"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {CALIBRATION}")
    return out


if __name__ == "__main__":
    print(main())
