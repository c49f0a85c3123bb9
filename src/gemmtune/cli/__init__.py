"""The `gemmtune` command: `main` parses and runs it; `doctor` and `bench` are two of its
commands."""
