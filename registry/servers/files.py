"""Sandboxed file-store MCP server: text files inside one folder, never outside it.

The folder is `--root DIR`, else `$NEXUS_FILES_ROOT`, else a fresh temporary folder (removed at exit).
Paths are relative, use '/' and may not leave the root (no absolute paths, no '..' escapes, no symlinks out).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from registry.atomic import write_atomic
from registry.decorator import tool
from registry.servers.runtime import ToolInputError, add_transport_arguments, handlers_from_functions, serve

MAX_FILE_BYTES = 1 << 20
ROOT: Path = Path(".")  # set by main()


def _resolve(path: str) -> Path:
    if not path or path.startswith(("/", "\\")) or "\x00" in path:
        raise ToolInputError(f"path {path!r} must be relative to the sandbox, e.g. notes/todo.txt")
    target = (ROOT / path).resolve()
    if not target.is_relative_to(ROOT):
        raise ToolInputError(f"path {path!r} leaves the sandbox")
    return target


@tool
def write_file(path: str, content: str) -> dict:
    """Write a text file, replacing it if it exists."""
    data = content.encode()
    if len(data) > MAX_FILE_BYTES:
        raise ToolInputError(f"content is {len(data)} bytes; the limit is {MAX_FILE_BYTES}")
    target = _resolve(path)
    write_atomic(target, data)  # a crash mid-write leaves the old file, never half of the new one
    return {"path": path, "bytes": len(data)}


@tool
def read_file(path: str) -> dict:
    """Read a text file."""
    target = _resolve(path)
    if not target.is_file():
        raise ToolInputError(f"no file {path!r}; list_files shows what exists")
    return {"path": path, "content": target.read_text(errors="replace")}


@tool
def list_files(prefix: str = "") -> dict:
    """List files whose path starts with a prefix, sorted."""
    paths = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file())
    return {"files": [p for p in paths if p.startswith(prefix)]}


@tool
def delete_file(path: str) -> dict:
    """Delete a file."""
    target = _resolve(path)
    if not target.is_file():
        raise ToolInputError(f"no file {path!r}")
    target.unlink()
    return {"deleted": path}


FUNCTIONS = [write_file, read_file, list_files, delete_file]


def main(argv: list[str] | None = None) -> None:
    global ROOT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.environ.get("NEXUS_FILES_ROOT"), help="sandbox folder")
    add_transport_arguments(parser)
    args = parser.parse_args(argv)
    if args.root:
        ROOT = Path(args.root).resolve()
        ROOT.mkdir(parents=True, exist_ok=True)
        serve("files", handlers_from_functions(FUNCTIONS), args=args)
    else:
        with tempfile.TemporaryDirectory(prefix="nexus-files-") as tmp:
            ROOT = Path(tmp).resolve()
            serve("files", handlers_from_functions(FUNCTIONS), args=args)


if __name__ == "__main__":
    main()
