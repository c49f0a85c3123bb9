"""Writing files that other processes read at the same time."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write` on a temporary file beside `path`, then rename it into place, holding the
    path's lock, so that readers never see a partial file and writers never interleave."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        fd, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=path.stem + ".", suffix=".tmp" + path.suffix
        )
        os.close(fd)
        try:
            write(Path(temporary))
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
