"""The block file (`.kvb`): a checked header plus K/V laid out for zero-copy memory mapping.

Layout: 8-byte magic, u64 little-endian header length, the header (canonical JSON, UTF-8, padded with spaces
to a 64-byte boundary), then the payload. MLX blocks hold `keys` and `values` as C-ordered float32 arrays of
shape (L, Hkv, T, D), keys post-RoPE at positions anchor..anchor+T-1; llama.cpp blocks hold the backend's
opaque per-sequence state (`blob`). The header's `checksum` is blake2b-128 over the header without it plus
the payload, so a flipped bit anywhere, a truncated file or a foreign header is refused.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from native.base import KVRange
from registry.atomic import write_atomic

MAGIC = b"NXKVB\x00\x01\x00"
FORMAT_VERSION = 2  # 2: blocks carry `context` (compiled after generic conversation tokens)
_ALIGN = 64


class BlockError(ValueError):
    """A block file that must not be spliced; the message says which file, what is wrong and what to do."""


@dataclass(frozen=True)
class BlockKey:
    """What a block must match to be spliced into a session."""

    backend: str
    fingerprint: str
    tokenizer: str
    tool: str
    schema_hash: str
    context: int = 0  # generic conversation tokens the block was compiled after (splice.prompt.CONTEXTS)


def _digest(header: dict, payload: memoryview | bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({k: v for k, v in header.items() if k != "checksum"}, sort_keys=True).encode())
    h.update(payload)
    return h.hexdigest()


def write_block(path: Path, header: dict, kv: KVRange) -> Path:
    """Write `kv` with `header` atomically (temporary file in the same folder, fsync, rename)."""
    header = dict(header, format_version=FORMAT_VERSION, positions=[int(kv.positions[0]), int(kv.positions[-1]) + 1],
                  token_ids=[int(t) for t in kv.tokens], n_tokens=len(kv))
    if kv.keys is not None:
        k, v = np.ascontiguousarray(kv.keys, np.float32), np.ascontiguousarray(kv.values, np.float32)
        header["payload"] = {"kind": "arrays", "dtype": "float32", "shape": list(k.shape), "nbytes": k.nbytes}
        payload = k.tobytes() + v.tobytes()
    elif kv.blob is not None:
        header["payload"] = {"kind": "blob", "nbytes": len(kv.blob), "layout": kv.meta}
        payload = kv.blob
    else:
        raise BlockError("a KV range with neither arrays nor a state blob cannot be written")
    header["checksum"] = _digest(header, payload)
    text = json.dumps(header, sort_keys=True).encode()
    text += b" " * (-(len(MAGIC) + 8 + len(text)) % _ALIGN)
    head = MAGIC + len(text).to_bytes(8, "little") + text

    def _write(f) -> None:
        f.write(head)
        f.write(payload)

    write_atomic(path, _write)
    return path


def read_header(path: Path) -> tuple[dict, int]:
    """The header of a block file and the payload offset; raises BlockError for anything malformed."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise BlockError(f"{path}: not a Nexus KV block (bad magic); run `nexus compile` to rebuild it")
            n = int.from_bytes(head[8:], "little")
            if n > os.fstat(f.fileno()).st_size:  # a garbled length must not allocate gigabytes
                raise BlockError(f"{path}: header length {n} exceeds the file (corrupted); run `nexus compile`")
            text = f.read(n)
    except OSError as e:
        raise BlockError(f"{path}: cannot read block ({e})") from None
    if len(text) != n:
        raise BlockError(f"{path}: truncated header; run `nexus compile` to rebuild it")
    try:
        header = json.loads(text)
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise BlockError(f"{path}: unreadable header; run `nexus compile` to rebuild it") from None
    if header.get("format_version") != FORMAT_VERSION:
        raise BlockError(f"{path}: block format {header.get('format_version')} != {FORMAT_VERSION}; recompile it")
    return header, 16 + n


def load_block(path: Path, expect: BlockKey) -> tuple[dict, KVRange]:
    """Map a block file, verify header fields against `expect` and the checksum; return (header, KVRange).

    Arrays are read-only views of the mapping (no copy until the backend imports them).
    Raises BlockError naming the first mismatch: the caller recompiles or falls back to text prefill.
    """
    path = Path(path)
    header, offset = read_header(path)
    for field, want in vars(expect).items():
        if header.get(field) != want:
            raise BlockError(f"{path}: block was built for {field}={header.get(field)!r}, need {want!r}; recompile it")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        p = header.get("payload", {})
        need = offset + (2 * p.get("nbytes", 0) if p.get("kind") == "arrays" else p.get("nbytes", 0))
        if size != need:
            raise BlockError(f"{path}: file is {size} bytes, header says {need} (truncated or padded); recompile it")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    payload = memoryview(mm)[offset:]
    if _digest(header, payload) != header.get("checksum"):
        raise BlockError(f"{path}: checksum mismatch (corrupted block); recompile it with `nexus compile`")
    a, b = header["positions"]
    positions = np.arange(a, b, dtype=np.int64)
    tokens = np.asarray(header["token_ids"], dtype=np.int64)
    if p["kind"] == "arrays":
        k = np.frombuffer(mm, dtype=np.float32, count=p["nbytes"] // 4, offset=offset).reshape(p["shape"])
        v = np.frombuffer(mm, dtype=np.float32, count=p["nbytes"] // 4, offset=offset + p["nbytes"]).reshape(p["shape"])
        return header, KVRange(positions=positions, tokens=tokens, keys=k, values=v)
    return header, KVRange(positions=positions, tokens=tokens, blob=bytes(payload), meta=p["layout"])
