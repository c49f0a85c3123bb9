"""The benchmark suites of gemmtune: `python -m benchmarks --list`."""
