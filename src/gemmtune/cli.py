"""The `gemmtune` command."""

from __future__ import annotations

import argparse
import json
import sys

from gemmtune import doctor


def _doctor(args: argparse.Namespace) -> int:
    targets = doctor.COMPILE_TARGETS if args.compile else ()
    report = doctor.report(compile_targets=targets)
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 0 if all(c["ok"] for c in report["compile"]) else 1


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
