"""The one entry to gemmtune's benchmarks, run from the repository root:

    python -m benchmarks --list
    python -m benchmarks SUITE [--out-dir DIR] [--plot] [suite options]
    python -m benchmarks plot FILE.json [--out PNG]

A suite runs on a GPU and writes its results file (`<what>-<gpu>-<date>.json`, the format of
`benchmarks/README.md`) into `--out-dir` (default `benchmarks/results/`); `--plot` draws it as
a PNG beside it. `plot` draws an existing file, which is how the README's figures are made.
`--list` and `plot` need no GPU.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

#: suite name -> the module that runs it: `SUITE_HELP: str` and `main(argv) -> Path`, the
#: results file it wrote
SUITES = {
    "public": "benchmarks.public",
    "serving": "benchmarks.serving",
    "dispatch": "benchmarks.dispatch",
    "tuning-cost": "benchmarks.tuning_cost",
    "pretune": "benchmarks.pretune",
    "kernel": "benchmarks.kernel",
    "peers": "benchmarks.peers",
    "cache": "benchmarks.cache",
    "timings": "benchmarks.timings",
    "first-pass": "benchmarks.first_pass",
    "read-ceiling": "benchmarks.read_ceiling",
    "decode-chain": "benchmarks.decode_chain",
    "int8-layouts": "benchmarks.int8_layouts",
    "placements": "benchmarks.placements",
}
PLOT_HELP = "draw an existing results file as a PNG: plot FILE.json [--out PNG]"


def suite_module(name: str) -> ModuleType:
    return importlib.import_module(SUITES[name])


def suite_list() -> str:
    """One line per suite, its name and what it measures (the suites are imported for it)."""
    width = max(map(len, SUITES))
    lines = [f"{name:<{width}}  {suite_module(name).SUITE_HELP}" for name in SUITES]
    return "\n".join([*lines, f"{'plot':<{width}}  {PLOT_HELP}"])


def run_suite(name: str, argv: list[str], draw: bool) -> int:
    """Run suite `name` with its options `argv`; with `draw`, plot what it wrote."""
    if draw:
        from benchmarks.plot import require_matplotlib

        require_matplotlib()  # before the suite's minutes, not after them
    results = suite_module(name).main(argv)
    print(f"results: {results}")
    if draw:
        from benchmarks.plot import NothingToPlot, plot

        try:
            print(f"plot: {plot(results)}")
        except NothingToPlot as exc:
            print(f"no plot: {exc}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        usage="python -m benchmarks [--list] SUITE [--out-dir DIR] [--plot] [suite options]"
        " | plot FILE.json [--out PNG]",
        description="Run a benchmark suite on the GPU, or plot a results file. "
        "`python -m benchmarks SUITE --help` lists a suite's options.",
        epilog=f"suites: {', '.join(SUITES)} (--list says what each measures)",
    )
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument("suite", nargs="?", help="a suite, or plot")
    parser.add_argument("options", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.list:
        print(suite_list())
        return 0
    if args.suite is None:
        parser.error("name a suite (--list lists them), or plot FILE.json")
    if args.suite == "plot":
        from benchmarks.plot import main as plot_main

        return plot_main(args.options)
    if args.suite not in SUITES:
        parser.error(f"unknown suite {args.suite!r}: the suites are {', '.join(SUITES)} (or plot)")
    draw = "--plot" in args.options  # ours, wherever it stands among the suite's options
    options = [option for option in args.options if option != "--plot"]
    return run_suite(args.suite, options, draw)


if __name__ == "__main__":
    sys.exit(main())
