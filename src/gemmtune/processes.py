"""Starting helper processes (compile pool, benchmark worker) that never re-run the user's script.

A spawned process re-imports the parent's main script so that functions defined there can be
found: a script without an `if __name__ == "__main__":` guard that calls `tuned_gemm` at its
top level would run again in every helper, which then tries to start helpers of its own and
dies. Our helpers need nothing from the main script, so it is hidden from `multiprocessing`
while they start. (`@autotune` on a function defined in the main script is the exception: its
worker must import the script, which then needs the guard, as with any multiprocessing code.)
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_saved: dict[str, object] = {}


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """Processes spawned inside this block do not import the main script. Re-entrant and
    thread-safe: the script is restored when the last block ends."""
    global _depth
    main = sys.modules.get("__main__")
    with _lock:
        if _depth == 0 and main is not None:
            _saved.clear()
            _saved.update(
                {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
            )
            main.__dict__.pop("__file__", None)
            main.__spec__ = None
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and main is not None:
                main.__dict__.update(_saved)
                if "__spec__" not in _saved:
                    main.__dict__.pop("__spec__", None)
