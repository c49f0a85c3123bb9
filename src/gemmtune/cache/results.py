"""Level 2: tuning results, from a problem's bucket key to the best config.

Stored in SQLite (WAL mode, so readers never block the writer and several processes can
write at once) in the cache directory, with a dictionary in front so that a hit costs a
dictionary lookup. A key holds the GPU and the versions (`buckets.bucket_key`), so a result
tuned elsewhere is never found, hence never reused silently. A database that cannot be read is
set aside with a warning and a new one started.

A key is tuned once, whatever the number of processes that need it (`tune_once`): the first
takes the key's lock (a file in `locks/`, locked with `flock`, which the operating system
releases when its holder exits or dies, so no dead process leaves it held) and tunes; the
others wait on the lock and then read the record it stored. Two processes never tune one
bucket at the same time, and all of them run the same winner.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from gemmtune.core.config import GemmConfig
from gemmtune.core.settings import cache_dir

log = logging.getLogger(__name__)

#: How long a process waits for another's tune of the same key before tuning it itself.
TUNE_WAIT_S = 900.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    ms REAL,
    record TEXT NOT NULL,
    updated REAL NOT NULL
)
"""


@dataclass(frozen=True)
class TunedRecord:
    """What the cache keeps for a bucket: the best config and how it was found."""

    config: str  # GemmConfig key
    ms: float | None
    runners_up: tuple[tuple[str, float], ...] = ()
    tuned_at: float = field(default_factory=time.time)
    how: str = ""  # how it was found, for people
    shape: tuple[int, int, int, int] = (0, 0, 0, 0)  # the (m, n, k, l) that was tuned
    #: a record of one shape, checked against its bucket's record (`api.choice`): that
    #: record's `tuned_at`, so that a bucket tuned again makes the check stale
    bucket_tuned_at: float | None = None

    @property
    def gemm_config(self) -> GemmConfig:
        return GemmConfig.from_key(self.config)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TunedRecord:
        data = json.loads(text)
        data["runners_up"] = tuple(tuple(r) for r in data.get("runners_up", ()))
        data["shape"] = tuple(data.get("shape", (0, 0, 0, 0)))
        return cls(**data)


class ResultsCache:
    """The results table of one cache directory."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else cache_dir() / "results.sqlite"
        self.memory: dict[str, TunedRecord] = {}
        self._local = threading.local()

    # -- connection ------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(SCHEMA)
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = self._open()
            except sqlite3.DatabaseError as exc:
                conn = self._recover(exc)
            self._local.conn = conn
        return conn

    def _recover(self, exc: Exception) -> sqlite3.Connection:
        """Set an unreadable database aside and start a new one."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        log.warning("results cache %s is unreadable (%s); moved to %s", self.path, exc, aside)
        for suffix in ("", "-wal", "-shm"):
            part = Path(str(self.path) + suffix)
            if part.exists():
                part.replace(Path(str(aside) + suffix))
        self._local.conn = None
        return self._open()

    def _execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self._conn().execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            self._local.conn = self._recover(exc)
            return self._local.conn.execute(sql, params).fetchall()

    # -- records ---------------------------------------------------------------------------

    def lookup(self, key: str, *, fresh: bool = False) -> TunedRecord | None:
        """The record of `key`, from memory or from disk (`fresh`: from disk, for a record
        another process may have replaced); None when there is none."""
        record = None if fresh else self.memory.get(key)
        if record is None:
            rows = self._execute("SELECT record FROM results WHERE key = ?", (key,))
            if rows:
                record = TunedRecord.from_json(rows[0][0])
                self.memory[key] = record
        return record

    def holds_prefix(self, prefix: str) -> bool:
        """Whether some key starts with `prefix`."""
        rows = self._execute(
            "SELECT 1 FROM results WHERE key >= ? AND key < ? LIMIT 1", (prefix, prefix + "\uffff")
        )
        return bool(rows)

    def store(self, key: str, record: TunedRecord) -> None:
        self._execute(
            "INSERT OR REPLACE INTO results (key, config, ms, record, updated) VALUES (?,?,?,?,?)",
            (key, record.config, record.ms, record.to_json(), time.time()),
        )
        self.memory[key] = record

    def tune_once(
        self,
        key: str,
        tune: Callable[[], TunedRecord | None],
        *,
        replace: bool = False,
        wait_s: float = TUNE_WAIT_S,
    ) -> TunedRecord | None:
        """The record of `key`; where there is none (or with `replace`), `tune()`'s, stored.
        Processes sharing this cache tune a key one at a time: a process that finds the key's
        lock held waits for it (up to `wait_s`, then tunes without it) and takes the record the
        holder stored. `tune` returns None when it found nothing to store."""
        if not replace and (record := self.lookup(key)) is not None:
            return record
        lock = FileLock(self.lock_path(key))
        try:
            lock.acquire(timeout=wait_s)
        except Timeout:
            log.warning("waited %.0f s for another process's tune of %s; tuning here", wait_s, key)
            return self._store_tuned(key, tune)
        try:
            if not replace and (record := self.lookup(key, fresh=True)) is not None:
                return record  # another process tuned it while this one waited
            return self._store_tuned(key, tune)
        finally:
            lock.release()

    def _store_tuned(self, key: str, tune: Callable[[], TunedRecord | None]) -> TunedRecord | None:
        record = tune()
        if record is not None:
            self.store(key, record)
        return record

    def lock_path(self, key: str) -> Path:
        """The lock file of `key`'s tune."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        path = self.path.parent / "locks" / f"{digest}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def items(self) -> list[tuple[str, TunedRecord]]:
        rows = self._execute("SELECT key, record FROM results ORDER BY key")
        return [(key, TunedRecord.from_json(text)) for key, text in rows]

    def clear(self) -> int:
        """Forget every result; returns how many there were."""
        count = self._execute("SELECT COUNT(*) FROM results")[0][0]
        self._execute("DELETE FROM results")
        self.memory.clear()
        return count

    # -- sharing ---------------------------------------------------------------------------

    def export(self, path: Path) -> int:
        """Write every result to a JSON file a team can ship with its model."""
        items = [{"key": k, "record": json.loads(r.to_json())} for k, r in self.items()]
        Path(path).write_text(json.dumps({"gemmtune_results": 1, "results": items}, indent=1))
        return len(items)

    def import_(self, path: Path) -> int:
        """Add the results of an exported file (they replace results under the same keys)."""
        data = json.loads(Path(path).read_text())
        if data.get("gemmtune_results") != 1:
            raise ValueError(f"{path} is not a gemmtune results export")
        for item in data["results"]:
            self.store(item["key"], TunedRecord.from_json(json.dumps(item["record"])))
        return len(data["results"])
