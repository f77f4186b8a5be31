"""Build or incrementally rebuild the buffer file from a list of tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from slb.buffer import BufferData, BufferMismatchError, SLBuffer, quantize_rows, write_buffer
from slb.duplicates import MAX_TOOLS, duplicate_pairs
from slb.embedder import Embedder
from slb.tools import ToolEntry, as_entry, example_texts, row_key
from slb.twostage import COARSE_DIM, TWO_STAGE_MIN_ROWS, fit_rotation


@dataclass
class BuildReport:
    """What a (re)build did: rows reused from the old file, tools embedded, tools dropped."""

    path: str
    count: int
    reused: int
    embedded: int
    removed: int
    rebuilt_from_scratch: bool
    rows: int = 0  # buffer rows: tools plus example rows
    examples_embedded: int = 0
    duplicates: list = field(default_factory=list)  # (name, name, cosine) near-duplicate pairs (slb.duplicates)
    from_store: int = 0  # tools not in the old buffer whose vectors were in memory or the embedding store

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def build_buffer(tools: list, embedder: Embedder, path: str | Path, keep_calibration: bool = False) -> BuildReport:
    """Write the buffer for `tools` (ToolEntry, registry Tools or MCP dicts) to `path`.

    Each tool gets one row for its text plus one per example request (`ToolEntry.examples`, embedded as
    queries; see slb.tools.example_texts); with no examples at all the buffer has one row per tool.
    Rows of an existing buffer built by the same embedder are reused when their content key (schema hash
    for the tool text, slb.tools.row_key for an example) is unchanged (no re-embedding); others are embedded.
    The other tools' vectors come from `embedder.embed_tools` (its memory, its embedding store, else the model).
    A buffer from another embedder is rebuilt from scratch.
    Near-duplicate pairs (slb.duplicates) of the tool-text rows are stored in the header.
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
    reuse: dict[str, int] = {}
    old_rows = None
    if old is not None:
        old_rows = old.index.rows_f32()  # dequantized, rotation undone: the embedder's basis
        reuse = {h: i for i, h in enumerate(old.row_keys or old.hashes)}
    todo = [t for t in entries if t.schema_hash not in reuse]
    fresh_x = embedder.embed_tools(todo) if todo else None
    fresh = {t.schema_hash: j for j, t in enumerate(todo)}
    examples = [example_texts(t) for t in entries]
    todo_ex = list(dict.fromkeys(e for ex in examples for e in ex if row_key(e) not in reuse))
    fresh_ex = embedder.embed_texts(todo_ex) if todo_ex else None
    fresh_ex_at = {row_key(e): j for j, e in enumerate(todo_ex)}
    dim = embedder.dim
    grouped = any(examples)
    keys = [k for t, ex in zip(entries, examples) for k in (t.schema_hash, *map(row_key, ex))]
    x = np.zeros((len(keys), dim), np.float32)
    for i, key in enumerate(keys):
        if key in reuse:
            x[i] = old_rows[reuse[key]]
        elif key in fresh:
            x[i] = fresh_x[fresh[key]]
        else:
            x[i] = fresh_ex[fresh_ex_at[key]]
    row_tool = np.repeat(np.arange(len(entries), dtype=np.int32), [1 + len(ex) for ex in examples])
    first = np.r_[0, np.cumsum([1 + len(ex) for ex in examples])[:-1]].astype(np.int64)  # tool-text rows
    pairs = duplicate_pairs(x[first]) if len(entries) <= MAX_TOOLS else None
    rotation, coarse = None, 0
    if len(keys) >= TWO_STAGE_MIN_ROWS and dim > COARSE_DIM:
        # Two-stage layout: refit the PCA rotation on the whole registry. Reused rows of a rotated buffer
        # pass through one more INT8 rounding here (they are rebuilt from their dequantized values).
        rotation, coarse = fit_rotation(x), COARSE_DIM
        x = x @ rotation.T
    m8, scales = quantize_rows(x)  # idempotent on dequantized unrotated rows: small rebuilds are exact
    hashes = [t.schema_hash for t in entries]
    calibration = {}
    if old is not None and (keep_calibration or sorted(old.hashes) == sorted(hashes)):
        calibration = old.calibration
    removed = len(set(old.hashes) - set(hashes)) if old is not None else 0
    write_buffer(path, BufferData(embedder.model_id, dim, names, hashes, m8, scales, calibration, rotation, coarse,
                                  row_tool if grouped else None, keys if grouped else None, pairs))
    embedded = embedder.last.embedded if todo else 0
    return BuildReport(str(path), len(entries), len(entries) - len(todo), embedded, removed, scratch,
                       len(keys), len(todo_ex), [(names[a], names[b], c) for a, b, c in pairs or []],
                       from_store=len(todo) - embedded)
