"""Build or incrementally rebuild the buffer file from a list of tools."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slb.buffer import BufferData, BufferMismatchError, SLBuffer, quantize_rows, write_buffer
from slb.embedder import Embedder
from slb.tools import ToolEntry, as_entry


@dataclass
class BuildReport:
    """What a (re)build did: rows reused from the old file, tools embedded, tools dropped."""

    path: str
    count: int
    reused: int
    embedded: int
    removed: int
    rebuilt_from_scratch: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def build_buffer(tools: list, embedder: Embedder, path: str | Path, keep_calibration: bool = False) -> BuildReport:
    """Write the buffer for `tools` (ToolEntry, registry Tools or MCP dicts) to `path`.

    Rows of an existing buffer built by the same embedder are reused for tools whose schema hash is
    unchanged (no re-embedding); others are embedded. A buffer from another embedder is rebuilt from scratch.
    The stored calibration is dropped when the tool set changes (tau does not transfer across registry sizes)
    unless keep_calibration.
    """
    entries: list[ToolEntry] = [as_entry(t) for t in tools]
    names = [t.name for t in entries]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})[:5]
        raise ValueError(f"duplicate tool names {dup}: the SLB routes by name, register each tool once")
    old: SLBuffer | None = None
    scratch = True
    path = Path(path)
    if path.exists():
        try:
            old = SLBuffer(path, model_id=embedder.model_id)
            scratch = False
        except BufferMismatchError:
            old = None
    reuse: dict[str, tuple[np.ndarray, float]] = {}
    if old is not None:
        for i, h in enumerate(old.hashes):
            reuse[h] = (np.array(old.m8[i]), float(old.scales[i]))
    todo = [t for t in entries if t.schema_hash not in reuse]
    fresh_m8, fresh_s = quantize_rows(embedder.embed_tools(todo)) if todo else (None, None)
    fresh = {t.schema_hash: (fresh_m8[j], fresh_s[j]) for j, t in enumerate(todo)}
    dim = embedder.dim
    m8 = np.zeros((len(entries), dim), np.int8)
    scales = np.zeros(len(entries), np.float32)
    for i, t in enumerate(entries):
        m8[i], scales[i] = reuse.get(t.schema_hash) or fresh[t.schema_hash]
    hashes = [t.schema_hash for t in entries]
    calibration = {}
    if old is not None and (keep_calibration or sorted(old.hashes) == sorted(hashes)):
        calibration = old.calibration
    removed = len(set(old.hashes) - set(hashes)) if old is not None else 0
    write_buffer(path, BufferData(embedder.model_id, dim, names, hashes, m8, scales, calibration))
    return BuildReport(str(path), len(entries), len(entries) - len(todo), len(todo), removed, scratch)
