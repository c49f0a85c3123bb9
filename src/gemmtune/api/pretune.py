"""Tuning a model's GEMMs ahead of time, on one GPU or split over several.

    gemmtune.pretune(model, batch_sizes=(1, 2, 4, ..., 4096), dtype=torch.bfloat16)
    gemmtune pretune --model-config llama3-8b.json --gpus 0,1

A model's GEMMs are known from its weights: every `nn.Linear` (and `TunedLinear`) of k inputs
and n outputs meets `x @ w.t()`, an (M x k) @ (k x n) product with `b` K-major, at every batch
size M, plus its bias where it has one (a bucket of its own where our kernel adds the bias,
`api.bias`). They are enumerated as results-cache buckets (`LinearShape` x batch size, one problem
per bucket); buckets the cache holds are skipped and the rest tuned one by one, each record
stored as soon as it is tuned, so an interrupted pretune keeps what it tuned and a rerun
resumes.

On several GPUs of one machine without a launcher (`pretune(..., gpus=[0, 1])`, `gemmtune
pretune --gpus 0,1`) one thread per GPU tunes in this process (`pretune_on_gpus`): each thread's
tunes time on its GPU's benchmark worker and share the compile workers, the kernel cache and
the results cache; a thread takes the next bucket no other has taken, longest first, and the
threads meet at the end of each round (`GpuThreads`). No process starts and no torch import is
repeated: two H200s pretune 16 buckets in 0.59-0.64 of one's time (`docs/tuning.md`).

Under `torch.distributed` (initialised by the caller: torchrun), the ranks split the work and
agree on one table:
1. every rank lists its buckets' keys (a key names the GPU model, so ranks on different
   models share no key) and which of them its cache holds; all ranks gather all lists;
2. `share_out` gives each held key one provider, the same on every rank (the lowest rank
   that holds it), and puts the keys no rank holds in queues, one per set of ranks that
   list them, longest work first;
3. each rank claims the next key of its queues from a counter in the group's store
   (`claimed`) and tunes it on its own GPU, until the queues are empty: a rank that started
   late or met slow buckets takes fewer, and none waits while work is left;
4. the ranks gather every provided record, and each stores every record of its own keys.
Every rank then holds the same record for each key, by construction. Processes sharing a GPU
and a cache tune a bucket once between them (`ResultsCache.tune_once`'s lock).
A problem whose bucket was tuned on another of its shapes is then checked on its own shape
(`api.choice`), the ranks sharing those checks in the same way, so that serving meets no check.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    bias: bool = False  # the layer adds a bias (one per output)


def linear_shapes(model: nn.Module, dtype: torch.dtype | None = None) -> list[LinearShape]:
    """The distinct GEMMs of `model`'s linear layers (`nn.Linear`, `TunedLinear`), read from
    their weights without running the model; `dtype` overrides the weights' (a model loaded in
    float32 and served in bf16)."""
    from gemmtune.api.torch_ops import TunedLinear

    shapes: dict[tuple, LinearShape] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, TunedLinear)):
            n, k = module.weight.shape
            biased = module.bias is not None
            shape = LinearShape(name, n, k, dtype or module.weight.dtype, biased)
            shapes.setdefault((shape.n, shape.k, shape.dtype, shape.bias), shape)
    return list(shapes.values())


def shapes_from_config(config: dict) -> list[LinearShape]:
    """The GEMMs a model config names: `{"dtype": "bf16", "linears": [{"name": "qkv", "n":
    6144, "k": 4096, "bias": true}, ...]}`, or a Llama-style config (`hidden_size`,
    `intermediate_size`, `num_attention_heads`, `num_key_value_heads`, optional `head_dim`,
    `attention_bias` and `mlp_bias`), whose layer has a qkv, an o, a fused gate-up and a down
    projection."""
    dtype = dtypes.torch_dtype(config.get("dtype", "bf16"))
    if "linears" in config:
        return [
            LinearShape(
                e.get("name", f"linear{i}"), int(e["n"]), int(e["k"]), dtype,
                bool(e.get("bias", False)),
            )
            for i, e in enumerate(config["linears"])
        ]  # fmt: skip
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
    attention, mlp = bool(config.get("attention_bias")), bool(config.get("mlp_bias"))
    return [
        LinearShape("qkv", (heads + 2 * kv_heads) * head_dim, hidden, dtype, attention),
        LinearShape("o", hidden, heads * head_dim, dtype, attention),
        LinearShape("gate_up", 2 * intermediate, hidden, dtype, mlp),
        LinearShape("down", hidden, intermediate, dtype, mlp),
    ]


@dataclass(frozen=True)
class GemmShape:
    """One problem to pretune, without a device: `a (m x k) @ b (k x n)`, a batch of `l` where
    given; `layout` names A then B, "t" for K-major ("tt" is `x @ w.t()`); `bias`: plus a bias
    per output column, in the output's type."""

    m: int
    n: int
    k: int
    l: int | None = None
    dtype: torch.dtype = torch.bfloat16
    layout: str = "tt"
    bias: bool = False

    def problem(self, device: torch.device | int | str) -> GemmProblem:
        """The problem tuned_gemm meets: with a bias, the one whose kernel adds it, or where no
        kernel of this GPU adds one (`api.bias`), the product the bias is added to."""
        options = {"dtype": self.dtype, "layout": self.layout, "device": device}
        p = GemmProblem.of_shape(self.m, self.n, self.k, self.l, **options, bias=self.bias)
        if any(reason.code == "bias" for reason in p.fallback_reasons):
            p = GemmProblem.of_shape(self.m, self.n, self.k, self.l, **options)
        return p


def linear_gemms(shapes: Iterable[LinearShape], batch_sizes: Sequence[int]) -> list[GemmShape]:
    """One GEMM per (layer shape, batch size): (batch x k) @ (k x n) as `x @ w.t()` makes it,
    with the layer's bias."""
    return [GemmShape(m, s.n, s.k, dtype=s.dtype, bias=s.bias) for s in shapes for m in batch_sizes]


@dataclass(frozen=True)
class Shares:
    """How the ranks split a round's keys (`share_out`): the provider of each held key, and
    the keys no rank holds, queued per set of ranks that list them."""

    held: dict[str, int]
    queues: dict[tuple[int, ...], list[str]]


def share_out(
    keys_by_rank: Sequence[Sequence[str]],
    held_by_rank: Sequence[set[str]],
    work: Callable[[str], float] = lambda key: 0.0,
) -> Shares:
    """The same answer on every rank: each held key's provider is the lowest rank that holds
    it; the other keys queue by the ranks that list them (ranks on one GPU model list the
    same keys), each queue by decreasing `work` and then in the order the lowest of those
    ranks lists them, so that the claims that end a queue are short ones."""
    listed_by: dict[str, list[int]] = {}
    for rank, keys in enumerate(keys_by_rank):
        for key in keys:
            listed_by.setdefault(key, []).append(rank)
    held: dict[str, int] = {}
    queues: dict[tuple[int, ...], list[str]] = {}
    for key, ranks in listed_by.items():
        holders = [r for r in ranks if key in held_by_rank[r]]
        if holders:
            held[key] = holders[0]
        else:
            queues.setdefault(tuple(ranks), []).append(key)
    for keys in queues.values():
        keys.sort(key=lambda k: -work(k))  # stable: ties keep the listing order
    return Shares(held, queues)


def claimed(store, name: str, keys: Sequence[str]) -> Iterator[str]:
    """The keys of one queue that this process claims, one at a time: the next unclaimed
    one, by an atomic counter `name` in `store` (a `torch.distributed.Store`) that every
    rank listing the queue draws from; each key goes to exactly one claimant."""
    while (index := store.add(name, 1) - 1) < len(keys):
        yield keys[index]


class GpuThreads:
    """The threads of a pretune on several GPUs of this process (`pretune_on_gpus`), one per
    GPU: each takes keys no other has taken, and all meet at the end of each round (a bucket's
    record must be stored before its shapes are checked)."""

    def __init__(self, gpus: int):
        self._lock = threading.Lock()
        self._takers: dict[tuple[str, str], int] = {}
        self.gpus = gpus
        self._barrier = threading.Barrier(gpus)

    def take(self, what: str, keys: Iterable[str], gpu: int) -> Iterator[str]:
        """The keys of `keys` that the thread of `gpu` takes, as it asks for each."""
        for key in keys:
            with self._lock:
                if (what, key) in self._takers:
                    continue
                self._takers[what, key] = gpu
            yield key

    def taker(self, what: str, key: str) -> int | None:
        """The GPU whose thread took `key`, if any."""
        with self._lock:
            return self._takers.get((what, key))

    def taken(self, what: str, keys: Iterable[str]) -> int:
        """How many of `keys` the threads have taken."""
        with self._lock:
            return sum((what, key) in self._takers for key in keys)

    def meet(self) -> None:
        """Wait for every thread to end its round (BrokenBarrierError where one failed)."""
        self._barrier.wait()

    def abort(self) -> None:
        """A thread failed: release the others from `meet`."""
        self._barrier.abort()


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
        """Buckets tuned by this process (not found in the cache, not tuned by another rank),
        on any of its GPUs."""
        return sum(row.source.partition(" on gpu")[0] == "tuned" for row in self.rows)

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
    threads: GpuThreads | None = None,
) -> PretuneResult:
    """Tune every bucket of `problems` the cache lacks and store it (see the module's
    docstring), then check each problem whose shape is not the one its bucket was tuned on
    (`ConfigChooser.checked_record`) where the cache lacks that check; with `distributed`
    (default: whether `torch.distributed` is initialised with more than one rank) the ranks
    split the work and all store every record; with `threads` this is one of the threads of
    `pretune_on_gpus`. Without `tune`, only report what the cache holds."""
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
    results = chooser.results_cache()
    if tune and chooser.tuner is None and any(results.lookup(k) is None for k in by_key):
        from gemmtune import workers

        # the helpers start while the ranks gather, not in the first tune
        tunes = 1 if threads is None else threads.gpus
        workers.start(next(iter(by_key.values())).device.index, tunes=tunes)
    rounds = _Rounds(chooser, distributed, tune, progress, threads)
    # the pretune's bar counts buckets; each tune's own bar would only interleave with it
    buckets = rounds.run(by_key, lambda p: chooser.ensure_tuned(p, progress=False), "bucket")
    # a bucket's record, tuned on one of its shapes, is checked on each of the others
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
    """Records provided by the ranks: each held key's lowest holder provides it, each other
    key the rank that claims it (`share_out`, `claimed`); then every rank stores every
    provided record."""

    def __init__(
        self,
        chooser: ConfigChooser,
        distributed: bool,
        tune: bool,
        progress: bool,
        threads: GpuThreads | None = None,
    ):
        import torch.distributed as dist

        self.chooser = chooser
        self.distributed = distributed
        self.tune = tune
        self.progress = progress
        self.threads = threads
        self.rank, self.ranks = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    def _rank_claims(
        self, problems: dict[str, GemmProblem], held: set[str], what: str
    ) -> tuple[Iterator[str], int, Callable[[], int], Shares]:
        """This rank's keys of a round, claimed as it asks for each (`share_out`, `claimed`):
        the keys, how many the queues it draws from hold, how many of those every rank has
        claimed so far, and the shares."""
        import torch.distributed as dist

        # a round's counters are named by a token of rank 0's: unique to this round
        gathered: list = [None] * self.ranks
        dist.all_gather_object(gathered, (list(problems), sorted(held), uuid.uuid4().hex))
        shares = share_out(
            [g[0] for g in gathered],
            [set(g[1]) for g in gathered],
            lambda key: problems[key].flops if key in problems else 0,
        )
        store = dist.distributed_c10d._get_default_store()
        prefix = f"gemmtune/pretune/{gathered[0][2]}/{what}"
        queues = {
            f"{prefix}/{','.join(map(str, ranks))}": queue
            for ranks, queue in shares.queues.items()
            if self.rank in ranks
        }
        mine = (key for name, queue in queues.items() for key in claimed(store, name, queue))

        def progress() -> int:
            return sum(min(store.add(name, 0), len(q)) for name, q in queues.items())

        return mine, sum(map(len, queues.values())), progress, shares

    def _thread_claims(
        self, problems: dict[str, GemmProblem], held: set[str], what: str
    ) -> tuple[Iterator[str], int, Callable[[], int]]:
        """This thread's keys of a round, taken as it asks for each (`GpuThreads`), largest
        problem first: the keys, how many were open, how many of those every thread has
        taken so far."""
        threads = self.threads
        gpu = next((p.device.index for p in problems.values()), -1)
        queue = sorted((k for k in problems if k not in held), key=lambda k: -problems[k].flops)
        return threads.take(what, queue, gpu), len(queue), lambda: threads.taken(what, queue)

    def run(
        self,
        problems: dict[str, GemmProblem],
        provide: Callable[[GemmProblem], TunedRecord | None],
        what: str,
    ) -> dict[str, str]:
        """Provide the record of each key of `problems` (`provide` tunes or checks it):
        returns where each key's record came from, "cached", "tuned" (or "checked" for
        shapes; "tuned on gpu N" where the threads of `pretune_on_gpus` share the work),
        "rank N" (another rank), or "failed" where none provided one."""
        import torch.distributed as dist

        results = self.chooser.results_cache()
        keys = list(problems)
        held = {key for key in keys if results.lookup(key) is not None}
        if self.distributed:
            mine, todo, progress, shares = self._rank_claims(problems, held, what)
        elif self.threads is not None:
            mine, todo, progress = self._thread_claims(problems, held, what)
        else:
            mine = [k for k in keys if k not in held]
            todo, progress = len(mine), None
        done: set[str] = set()
        bar = tqdm(
            total=todo if self.tune else 0,
            disable=not self.progress,
            desc=f"gemmtune pretune ({what}s)",
            unit=what,
        )
        for key in mine if self.tune else ():
            p = problems[key]
            bar.set_postfix_str(f"{p.m}x{p.n}x{p.k}")
            try:
                record = provide(p)
            except Exception:  # one failure must not stop the rest, nor the other ranks
                log.exception("pretune: %dx%dx%d failed; its %s stays open", p.m, p.n, p.k, what)
                record = None
            if record is not None:
                done.add(key)
            bar.update(1 if progress is None else progress() - bar.n)
        bar.close()
        providers = {}
        if self.distributed:
            provided = {
                key: record.to_json()
                for key in keys
                if (key in done or shares.held.get(key) == self.rank)
                and (record := results.lookup(key)) is not None
            }
            gathered = [None] * self.ranks
            dist.all_gather_object(gathered, provided)
            for from_rank, records in enumerate(gathered):
                for key, text in records.items():
                    providers.setdefault(key, from_rank)
                    if key in problems and from_rank != self.rank:
                        results.store(key, TunedRecord.from_json(text))
        if self.threads is not None:
            self.threads.meet()
        fresh = "tuned" if what == "bucket" else "checked"

        def source(key: str) -> str:
            gpu = self.threads.taker(what, key) if self.threads is not None else None
            if gpu is not None and results.lookup(key) is not None:
                return f"{fresh} on gpu {gpu}"
            if key in done:
                return fresh
            if key in held:
                return "cached"
            if key in providers:
                return f"rank {providers[key]}"
            return "failed"

        return {key: source(key) for key in keys}


def pretune(
    model: nn.Module | None = None,
    *,
    shapes: Iterable[LinearShape] = (),
    gemms: Iterable[GemmShape] = (),
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    dtype: torch.dtype | None = None,
    device: torch.device | int | str | None = None,
    gpus: Sequence[int] | None = None,
    progress: bool = True,
) -> PretuneResult:
    """Tune every GEMM that `model`'s linear layers (and the layer `shapes`) meet at
    `batch_sizes`, and the `gemms` given as they are, on this process's GPU (`device`), or
    split over the `gpus` of this machine (`pretune_on_gpus`), storing what the cache lacks;
    under `torch.distributed` the ranks share the work and all end with the same table.
    `dtype` overrides the layers' weights' dtype. Returns the table (`PretuneResult.export`
    writes it for `gemmtune cache import`)."""
    found = list(shapes)
    if model is not None:
        found += linear_shapes(model)
    if dtype is not None:
        found = [LinearShape(s.name, s.n, s.k, dtype, s.bias) for s in found]
    every = [*linear_gemms(found, batch_sizes), *gemms]
    if gpus is not None and len(gpus) > 1:
        return pretune_on_gpus(every, gpus, progress=progress)
    if gpus:
        device = gpus[0]
    if device is None:
        device = torch.cuda.current_device()
    return pretune_problems([g.problem(device) for g in every], progress=progress)


def pretune_on_gpus(
    gemms: Sequence[GemmShape], gpus: Sequence[int], *, progress: bool = True
) -> PretuneResult:
    """`pretune` of `gemms` split over `gpus` of this machine, in this process: a thread per
    GPU (`GpuThreads`), each tuning on its GPU's benchmark worker, all sharing the compile
    workers and the caches (the module's docstring). Returns the table: each key once, from
    the first GPU that lists it, its source naming the GPU whose thread tuned it ("tuned on
    gpu 1")."""
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"gpus {list(gpus)} names a GPU twice")
    start = time.perf_counter()
    threads = GpuThreads(len(gpus))
    outcomes: list[PretuneResult | None] = [None] * len(gpus)
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            outcomes[index] = pretune_problems(
                [g.problem(gpus[index]) for g in gemms],
                progress=progress and index == 0,
                distributed=False,
                threads=threads,
            )
        except BaseException as exc:  # re-raised below; the other threads must not wait
            failures.append(exc)
            threads.abort()

    workers = [
        # daemons: ^C in the caller ends the pretune (the buckets tuned so far are stored)
        threading.Thread(target=run, args=(i,), name=f"gemmtune-pretune-gpu{gpu}", daemon=True)
        for i, gpu in enumerate(gpus)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    table = PretuneResult(wall_s=time.perf_counter() - start, ranks=len(gpus))
    listed: set[str] = set()
    for outcome in outcomes:
        for row in outcome.rows:
            if row.key not in listed:
                listed.add(row.key)
                table.rows.append(row)
    return table
