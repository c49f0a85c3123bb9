"""The `gemmtune` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemmtune import doctor


def _doctor(args: argparse.Namespace) -> int:
    targets = doctor.COMPILE_TARGETS if args.compile else ()
    report = doctor.report(compile_targets=targets)
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 0 if all(c["ok"] for c in report["compile"]) else 1


def _cache(args: argparse.Namespace) -> int:
    from gemmtune.cache.results import ResultsCache

    results = ResultsCache()
    if args.action == "export":
        print(f"exported {results.export(args.file)} results to {args.file}")
    elif args.action == "import":
        print(f"imported {results.import_(args.file)} results from {args.file}")
    elif args.action == "clear":
        print(f"cleared {results.clear()} results from {results.path}")
    else:
        rows = [(key, record) for key, record in results.items()]
        if args.json:
            print(json.dumps([{"key": k, **json.loads(r.to_json())} for k, r in rows], indent=1))
        else:
            for key, record in rows:
                ms = f"{record.ms:.4f} ms" if record.ms is not None else "untimed"
                print(f"{key}\n    {record.config}  {ms}  ({record.how})")
            print(f"{len(rows)} results in {results.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gemmtune", description="Autotuned CuTe DSL GEMM kernels for Hopper and Blackwell."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("doctor", help="show what this machine offers gemmtune")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also compile a small kernel for sm_90a and sm_100a (no GPU needed)",
    )
    p.set_defaults(run=_doctor)
    p = commands.add_parser("cache", help="the tuning results: show, clear, export, import")
    p.add_argument("action", choices=["show", "clear", "export", "import"])
    p.add_argument("file", nargs="?", type=Path, help="the JSON file to export to or import")
    p.add_argument("--json", action="store_true", help="show as JSON")
    p.set_defaults(run=_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "action", None) in ("export", "import") and args.file is None:
        parser.error(f"cache {args.action} needs a FILE")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
