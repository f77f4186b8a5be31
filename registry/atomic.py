"""Atomic file writes: every artefact Nexus reads back later is written through `write_atomic`.

The bytes go to a temporary file in the destination's folder, are flushed and fsynced, then renamed over the
destination (`os.replace`, atomic on POSIX), and the folder is fsynced so the rename itself survives a crash.
A reader therefore sees the old file or the complete new one, never a partial write; a failed write (disk
full, file size limit, exception in `write`) removes the temporary file and leaves the old file untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomic(path: str | Path, content: bytes | str | Callable[[BinaryIO], None]) -> Path:
    """Write `content` (bytes, UTF-8 text, or a function that writes to the open binary file) to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)  # mkstemp makes it 0600
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # disk full / file too large: name the file the user was writing, not the temp file
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def fsync_dir(folder: str | Path) -> None:
    """Make a rename inside `folder` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
