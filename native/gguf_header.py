"""A small, fast reader of GGUF metadata (the key/value header and the tensor directory).

The `gguf` package parses every string as its own array part, slow for a vocabulary of tens of thousands of
tokens and merges; this reads the header directly. Format (little-endian): magic "GGUF", u32 version, u64 tensor
count, u64 key/value count, the key/values, then per tensor: name, u32 n_dims, u64 dims, u32 type, u64
offset; tensor data starts at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from native.base import ModelError

GGUF_MAGIC = b"GGUF"
_SCALARS = {  # GGUF value type -> (struct code, numpy dtype)
    0: ("B", np.uint8), 1: ("b", np.int8), 2: ("H", np.uint16), 3: ("h", np.int16),
    4: ("I", np.uint32), 5: ("i", np.int32), 6: ("f", np.float32), 7: ("?", np.bool_),
    10: ("Q", np.uint64), 11: ("q", np.int64), 12: ("d", np.float64),
}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFHeader:
    path: str
    version: int
    metadata: dict
    tensors: dict[str, tuple[tuple[int, ...], int, int]]  # name -> (shape, ggml type, offset in data)
    data_offset: int  # byte offset of the tensor data section

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)


class _Cursor:
    def __init__(self, buf: memoryview, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise ModelError(f"{self.path}: truncated GGUF header "
                             f"(needs byte {self.pos + n}, file has {len(self.buf)})")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, code: str):
        return struct.unpack("<" + code, self.take(struct.calcsize(code)))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.scalar("I"), self.scalar("Q")
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype][1]).newbyteorder("<")
                return np.frombuffer(self.take(n * dt.itemsize), dtype=dt).copy()
            return [self.value(etype) for _ in range(n)]
        raise ModelError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")


def read_gguf_header(path: str) -> GGUFHeader:
    """Parse the metadata and tensor directory of a GGUF file; raise ModelError naming the file on bad input."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if head != GGUF_MAGIC:
                raise ModelError(f"{path}: not a GGUF file (starts with {head!r}, expected b'GGUF')")
            f.seek(0)
            # Headers are a few MB at most (vocabularies); read up to 64 MiB and fail clearly beyond.
            buf = memoryview(f.read(64 << 20))
    except OSError as e:
        raise ModelError(f"{path}: cannot read model file ({e.strerror})") from None
    cur = _Cursor(buf, path)
    cur.take(4)
    version = cur.scalar("I")
    if version not in (2, 3):
        raise ModelError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("I"))
    tensors = {}
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("I")
        dims = tuple(cur.scalar("Q") for _ in range(n_dims))
        tensors[name] = (dims, cur.scalar("I"), cur.scalar("Q"))
    align = int(meta.get("general.alignment", 32))
    data_offset = (cur.pos + align - 1) // align * align
    return GGUFHeader(path, version, meta, tensors, data_offset)
