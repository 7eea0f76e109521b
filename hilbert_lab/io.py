"""atomic_write: replace a file's content all at once (a leaf module: imports nothing from hilbert_lab)."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` (str as UTF-8, or bytes) to `path` through a temporary file in the same folder, fsync
    and rename: `path` holds either its previous complete content or the new one, never a partial file,
    and no temporary file is left behind, whether the write succeeds or fails."""
    if not isinstance(data, (str, bytes)):
        raise ValueError(f"data must be str or bytes, got {type(data).__name__}")
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # make the rename durable (not supported everywhere)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
