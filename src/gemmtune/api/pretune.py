"""Tuning a model's GEMMs ahead of time, on one GPU or split over several.

    gemmtune.pretune(model, batch_sizes=(1, 2, 4, ..., 4096), dtype=torch.bfloat16)
    gemmtune pretune --model-config llama3-8b.json --gpus 0,1

A model's GEMMs are known from its weights: every `nn.Linear` (and `TunedLinear`) of k inputs
and n outputs meets `x @ w.t()`, an (M x k) @ (k x n) product with `b` K-major, at every batch
size M. They are enumerated as results-cache buckets (`LinearShape` x batch size, one problem
per bucket); buckets the cache holds are skipped and the rest tuned one by one, each record
stored as soon as it is tuned, so an interrupted pretune keeps what it tuned and a rerun
resumes.

Under `torch.distributed` (initialised by the caller: torchrun, or `spawn_pretune` for
`--gpus`), the ranks split the work and agree on one table:
1. every rank lists its buckets' keys (a key names the GPU model, so ranks on different
   models share no key) and which of them its cache holds; all ranks gather all lists;
2. `assign_providers` gives each key one provider, the same on every rank: the lowest rank
   that holds it, else the ranks that list it in turn;
3. each rank tunes the keys it provides and does not hold, on its own GPU;
4. the ranks gather every provided record, and each stores every record of its own keys.
Every rank then holds the same record for each key, by construction. Processes sharing a GPU
and a cache tune a bucket once between them (`ResultsCache.tune_once`'s lock).
A problem whose bucket was tuned on another of its shapes is then checked on its own shape
(`api.choice`), the ranks sharing those checks in the same way, so that serving meets no check.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from gemmtune.api.choice import ConfigChooser, needs_rechoice, shape_checks
from gemmtune.cache.results import TunedRecord
from gemmtune.core import dtypes
from gemmtune.core.problem import GemmProblem

log = logging.getLogger(__name__)

#: Batch sizes a server meets: powers of two, one bucket each.
DEFAULT_BATCH_SIZES = tuple(1 << i for i in range(13))


@dataclass(frozen=True)
class LinearShape:
    """A linear layer's GEMM: `x @ w.t()` with `w` of `n` rows (outputs) and `k` columns."""

    name: str
    n: int
    k: int
    dtype: torch.dtype = torch.bfloat16


def linear_shapes(model: nn.Module, dtype: torch.dtype | None = None) -> list[LinearShape]:
    """The distinct GEMMs of `model`'s linear layers (`nn.Linear`, `TunedLinear`), read from
    their weights without running the model; `dtype` overrides the weights' (a model loaded in
    float32 and served in bf16)."""
    from gemmtune.api.torch_ops import TunedLinear

    shapes: dict[tuple, LinearShape] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, TunedLinear)):
            n, k = module.weight.shape
            shape = LinearShape(name, n, k, dtype or module.weight.dtype)
            shapes.setdefault((shape.n, shape.k, shape.dtype), shape)
    return list(shapes.values())


def shapes_from_config(config: dict) -> list[LinearShape]:
    """The GEMMs a model config names: `{"dtype": "bf16", "linears": [{"name": "qkv", "n":
    6144, "k": 4096}, ...]}`, or a Llama-style config (`hidden_size`, `intermediate_size`,
    `num_attention_heads`, `num_key_value_heads`, optional `head_dim`), whose layer has a qkv,
    an o, a fused gate-up and a down projection."""
    dtype = dtypes.torch_dtype(config.get("dtype", "bf16"))
    if "linears" in config:
        return [LinearShape(e.get("name", f"linear{i}"), int(e["n"]), int(e["k"]), dtype)
                for i, e in enumerate(config["linears"])]  # fmt: skip
    try:
        hidden = int(config["hidden_size"])
        intermediate = int(config["intermediate_size"])
        heads = int(config["num_attention_heads"])
    except KeyError as missing:
        raise ValueError(
            f"a model config needs 'linears' or the Llama-style sizes; {missing} is missing"
        ) from None
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim", hidden // heads))
    return [
        LinearShape("qkv", (heads + 2 * kv_heads) * head_dim, hidden, dtype),
        LinearShape("o", hidden, heads * head_dim, dtype),
        LinearShape("gate_up", 2 * intermediate, hidden, dtype),
        LinearShape("down", hidden, intermediate, dtype),
    ]


@dataclass(frozen=True)
class GemmShape:
    """One problem to pretune, without a device: `a (m x k) @ b (k x n)`, a batch of `l` where
    given; `layout` names A then B, "t" for K-major ("tt" is `x @ w.t()`)."""

    m: int
    n: int
    k: int
    l: int | None = None
    dtype: torch.dtype = torch.bfloat16
    layout: str = "tt"

    def problem(self, device: torch.device | int | str) -> GemmProblem:
        return GemmProblem.of_shape(
            self.m, self.n, self.k, self.l, dtype=self.dtype, layout=self.layout, device=device
        )


def linear_gemms(shapes: Iterable[LinearShape], batch_sizes: Sequence[int]) -> list[GemmShape]:
    """One GEMM per (layer shape, batch size): (batch x k) @ (k x n) as `x @ w.t()` makes it."""
    return [GemmShape(m, s.n, s.k, dtype=s.dtype) for s in shapes for m in batch_sizes]


def assign_providers(
    keys_by_rank: Sequence[Sequence[str]], held_by_rank: Sequence[set[str]]
) -> dict[str, int]:
    """Which rank provides each key's record, the same answer on every rank: the lowest rank
    that holds the key, else the ranks that list it, in turn over the keys none holds (in the
    order the lowest such rank lists them)."""
    providers: dict[str, int] = {}
    listed_by: dict[str, list[int]] = {}
    for rank, keys in enumerate(keys_by_rank):
        for key in keys:
            listed_by.setdefault(key, []).append(rank)
    turn: dict[tuple[int, ...], int] = {}
    for key, ranks in listed_by.items():
        holders = [r for r in ranks if key in held_by_rank[r]]
        if holders:
            providers[key] = holders[0]
        else:
            group = tuple(ranks)
            providers[key] = group[turn.get(group, 0) % len(group)]
            turn[group] = turn.get(group, 0) + 1
    return providers


@dataclass
class PretuneRow:
    """One bucket (or checked shape) of a pretune: its key, the shape it was listed with, its
    record."""

    key: str
    shape: tuple[int, int, int, int]
    record: TunedRecord | None
    source: str  # "cached", "tuned", "checked" (a shape), or "rank N" (by another rank)

    @property
    def config(self) -> str | None:
        return self.record.config if self.record else None


@dataclass
class PretuneResult:
    """What a pretune did: a row per bucket, in the order the buckets were listed."""

    rows: list[PretuneRow] = field(default_factory=list)
    wall_s: float = 0.0
    ranks: int = 1

    @property
    def tuned(self) -> int:
        """Buckets tuned here (not found in the cache, not tuned by another rank)."""
        return sum(row.source == "tuned" for row in self.rows)

    def export(self, path: Path | str) -> int:
        """Write the table in `gemmtune cache export`'s format (`gemmtune cache import` reads
        it on the serving machine); returns how many records it holds."""
        results = [
            {"key": row.key, "record": json.loads(row.record.to_json())}
            for row in self.rows
            if row.record is not None
        ]
        Path(path).write_text(json.dumps({"gemmtune_results": 1, "results": results}, indent=1))
        return len(results)


def pretune_problems(
    problems: Sequence[GemmProblem],
    *,
    chooser: ConfigChooser | None = None,
    progress: bool = True,
    distributed: bool | None = None,
    tune: bool = True,
) -> PretuneResult:
    """Tune every bucket of `problems` the cache lacks and store it (see the module's
    docstring), then check each problem whose shape is not the one its bucket was tuned on
    (`ConfigChooser.checked_record`) where the cache lacks that check; with `distributed`
    (default: whether `torch.distributed` is initialised with more than one rank) the ranks
    split the work and all store every record. Without `tune`, only report what the cache
    holds."""
    import torch.distributed as dist

    dispatcher = None
    if chooser is None:
        from gemmtune.api.dispatch import DISPATCHER

        dispatcher, chooser = DISPATCHER, DISPATCHER.chooser
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    start = time.perf_counter()
    served = [p for p in problems if p.supported]
    for p in problems:
        if not p.supported:
            log.info("pretune skips %dx%dx%d: %s", p.m, p.n, p.k, p.fallback_reason)
    by_key: dict[str, GemmProblem] = {}
    for p in served:
        by_key.setdefault(chooser.bucket_key(p), p)
    rounds = _Rounds(chooser, distributed, tune, progress)
    buckets = rounds.run(by_key, lambda p: chooser.ensure_tuned(p), "bucket")
    # a bucket's record, tuned on one of its shapes, is checked on each of the others
    results = chooser.results_cache()
    shapes: dict[str, GemmProblem] = {}
    for p in served if shape_checks() else ():
        record = results.lookup(chooser.bucket_key(p))
        if record is not None and needs_rechoice(record, p):
            shapes.setdefault(chooser.shape_key(p), p)

    def check(p: GemmProblem) -> TunedRecord | None:
        record = results.lookup(chooser.bucket_key(p))
        return chooser.checked_record(p, record, check=True) if record is not None else None

    checked = rounds.run(shapes, check, "shape")
    if dispatcher is not None:
        dispatcher.plans.clear()  # plans made before may follow records replaced here
    outcome = PretuneResult(wall_s=time.perf_counter() - start, ranks=rounds.ranks)
    for done, keys in ((buckets, by_key), (checked, shapes)):
        for key, p in keys.items():
            outcome.rows.append(
                PretuneRow(key, (p.m, p.n, p.k, p.l), results.lookup(key), done[key])
            )
    return outcome


class _Rounds:
    """Records provided by the ranks: each key's provider tunes it where no rank holds it,
    then every rank stores every provided record."""

    def __init__(self, chooser: ConfigChooser, distributed: bool, tune: bool, progress: bool):
        import torch.distributed as dist

        self.chooser = chooser
        self.distributed = distributed
        self.tune = tune
        self.progress = progress
        self.rank, self.ranks = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    def run(
        self,
        problems: dict[str, GemmProblem],
        provide: Callable[[GemmProblem], TunedRecord | None],
        what: str,
    ) -> dict[str, str]:
        """Provide the record of each key of `problems` (`provide` tunes or checks it):
        returns where each key's record came from, "cached", "tuned" (or "checked" for
        shapes) or "rank N"."""
        import torch.distributed as dist

        results = self.chooser.results_cache()
        keys = list(problems)
        held = {key for key in keys if results.lookup(key) is not None}
        if self.distributed:
            gathered: list = [None] * self.ranks
            dist.all_gather_object(gathered, (keys, sorted(held)))
            providers = assign_providers([g[0] for g in gathered], [set(g[1]) for g in gathered])
        else:
            providers = dict.fromkeys(keys, 0)
        mine = [k for k in keys if self.tune and providers[k] == self.rank and k not in held]
        done: set[str] = set()
        bar = tqdm(mine, disable=not self.progress, desc=f"gemmtune pretune ({what}s)", unit=what)
        for key in bar:
            p = problems[key]
            bar.set_postfix_str(f"{p.m}x{p.n}x{p.k}")
            try:
                record = provide(p)
            except Exception:  # one failure must not stop the rest, nor the other ranks
                log.exception("pretune: %dx%dx%d failed; its %s stays open", p.m, p.n, p.k, what)
                continue
            if record is not None:
                done.add(key)
        bar.close()
        if self.distributed:
            provided = {
                key: record.to_json()
                for key in keys
                if providers[key] == self.rank and (record := results.lookup(key)) is not None
            }
            gathered = [None] * self.ranks
            dist.all_gather_object(gathered, provided)
            for from_rank, records in enumerate(gathered):
                for key, text in records.items():
                    if key in problems and from_rank != self.rank:
                        results.store(key, TunedRecord.from_json(text))
        fresh = "tuned" if what == "bucket" else "checked"
        return {
            key: fresh if key in done else "cached" if key in held else f"rank {providers[key]}"
            for key in keys
        }


def pretune(
    model: nn.Module | None = None,
    *,
    shapes: Iterable[LinearShape] = (),
    gemms: Iterable[GemmShape] = (),
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    dtype: torch.dtype | None = None,
    device: torch.device | int | str | None = None,
    progress: bool = True,
) -> PretuneResult:
    """Tune every GEMM that `model`'s linear layers (and the layer `shapes`) meet at
    `batch_sizes`, and the `gemms` given as they are, on this process's GPU, storing what the
    cache lacks; under `torch.distributed` the ranks share the work and all end with the same
    table. `dtype` overrides the layers' weights' dtype. Returns the table
    (`PretuneResult.export` writes it for `gemmtune cache import`)."""
    found = list(shapes)
    if model is not None:
        found += linear_shapes(model)
    if dtype is not None:
        found = [LinearShape(s.name, s.n, s.k, dtype) for s in found]
    every = [*linear_gemms(found, batch_sizes), *gemms]
    if device is None:
        device = torch.cuda.current_device()
    return pretune_problems([g.problem(device) for g in every], progress=progress)


def _gpu_worker(rank: int, gpus: Sequence[int], init_file: str, gemms: list) -> None:
    """One process of `spawn_pretune`: its GPU, a gloo group with the others, its share."""
    import torch.distributed as dist

    torch.cuda.set_device(gpus[rank])
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=len(gpus)
    )
    try:
        pretune(gemms=gemms, device=gpus[rank], progress=rank == 0)
    finally:
        dist.destroy_process_group()


def spawn_pretune(gemms: Sequence[GemmShape], gpus: Sequence[int]) -> PretuneResult:
    """`pretune` of `gemms` split over `gpus` of this machine without a launcher: one process
    per GPU, joined in a gloo group (the records are small; NCCL is not needed for them).
    Returns the table as this process's cache then holds it."""
    import tempfile

    import torch.multiprocessing as mp

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gemmtune-pretune-") as folder:
        init_file = str(Path(folder) / "group")
        mp.spawn(_gpu_worker, args=(list(gpus), init_file, list(gemms)), nprocs=len(gpus))
    device = gpus[0]
    outcome = pretune_problems(
        [g.problem(device) for g in gemms], progress=False, distributed=False, tune=False
    )
    outcome.wall_s, outcome.ranks = time.perf_counter() - start, len(gpus)
    return outcome
