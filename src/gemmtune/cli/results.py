"""`gemmtune show`, `clear` and `cache`: the tuning results on disk."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Sequence

from gemmtune.cache.buckets import parse_key
from gemmtune.cli.text import fail, fmt, table


def _shape_text(shape: Sequence[int]) -> str:
    m, n, k, l = [*shape, 0, 0, 0, 0][:4]
    if not m:
        return "-"
    return f"{m}x{n}x{k}" + (f"x{l}" if l and l != 1 else "")


def show(args: argparse.Namespace) -> int:
    from gemmtune.cache.results import ResultsCache

    results = ResultsCache()
    rows = results.items()
    if args.json:
        out = [{"key": k, **parse_key(k), **json.loads(r.to_json())} for k, r in rows]
        print(json.dumps(out, indent=1))
        return 0
    if rows:
        lines = []
        for key, record in rows:
            part = parse_key(key)
            gpu = f"{part['gpu']} ({part['sms']})" if part["sms"] else part["gpu"]
            lines.append(
                [
                    part["bucket"],
                    part["signature"],
                    gpu,
                    _shape_text(record.shape),
                    record.config,
                    fmt(record.ms, ".4f"),
                    time.strftime("%Y-%m-%d %H:%M", time.localtime(record.tuned_at)),
                ]
            )
        headers = ["bucket", "signature", "GPU", "tuned shape", "winner", "ms", "tuned"]
        print(table(headers, lines, right="<<<><><"))
    print(f"{len(rows)} results in {results.path}")
    return 0


def clear(args: argparse.Namespace) -> int:
    from gemmtune.cache.results import ResultsCache
    from gemmtune.core.settings import cache_dir

    if getattr(args, "kernels", False):
        folder = cache_dir() / "kernels"
        if folder.is_dir():
            files = [f for f in folder.rglob("*") if f.is_file()]
            size = sum(f.stat().st_size for f in files)
            shutil.rmtree(folder, ignore_errors=True)
            print(f"removed {len(files)} compiled-kernel files ({size / 2**20:.1f} MiB): {folder}")
        else:
            print(f"no compiled kernels at {folder}")
    results = ResultsCache()
    print(f"cleared {results.clear()} results from {results.path}")
    return 0


def cache(args: argparse.Namespace) -> int:
    from gemmtune.cache.results import ResultsCache

    if args.action == "show":
        return show(args)
    if args.action == "clear":
        return clear(args)
    results = ResultsCache()
    try:
        if args.action == "export":
            print(f"exported {results.export(args.file)} results to {args.file}")
        else:
            print(f"imported {results.import_(args.file)} results from {args.file}")
    except (OSError, ValueError, KeyError) as exc:
        return fail(f"gemmtune cache {args.action}: {exc}", 1)
    return 0
