"""llama.cpp's per-sequence KV state, read far enough to move its V cache between the two layouts.

Without flash attention llama.cpp stores V transposed (one row per channel, a column per cell) and its
sequence state keeps that layout; with flash attention V rows are per cell like K. A state saved in one layout
is refused by a context in the other, so `set_v_layout` rewrites the V part: the same numbers, transposed.
The state (`llama_state_seq_get_data`, llama.cpp as packaged by llama-cpp-python 0.3.x): a u32 magic and a u32
version, then per KV cache (one, or two for a sliding-window model: global then local) a u32 stream count and
per stream: u32 cells, per cell (i32 position, u32 n, n x i32 sequence ids), u32 v_trans, u32 layers, per layer
K (i32 type, u64 row bytes, cells x row), then per layer V either like K or, transposed, (i32 type, u32 element
bytes, u32 channels, channels x cells elements). Anything else raises `BackendError` naming what was found.

`move_keys` re-anchors a state in the blob itself (positions moved, keys rotated by RoPE) so that an import
needs no llama.cpp K-shift, which rotates every cell of the cache, not only the imported ones.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from native.base import BackendError

ELEMENT_BYTES = {0: 4, 1: 2, 30: 2}  # ggml types V can be transposed in: F32, F16, BF16 (quantized V needs FA)
_F32, _F16, _BF16 = 0, 1, 30
_HEADER = 8


def _unpack(fmt: str, blob: bytes, at: int) -> tuple:
    try:
        return struct.unpack_from("<" + fmt, blob, at)
    except struct.error:
        raise BackendError(f"llama.cpp KV state ends early at byte {at} of {len(blob)}: not a layout this "
                           "version of Nexus can read") from None


@dataclass(frozen=True)
class Stream:
    """One stream of one KV cache in a state: where its v_trans flag and its V part lie (byte offsets)."""

    cells_at: int
    flag_at: int
    v_start: int
    v_end: int
    cells: int
    n_layer: int
    transposed: bool


def read_streams(blob: bytes) -> list[Stream]:
    """Every non-empty stream of the state, in order; raises BackendError unless the walk ends at the last byte."""
    at, out = _HEADER, []
    while at < len(blob):
        (n_stream,), at = _unpack("I", blob, at), at + 4
        for _ in range(n_stream):
            (cells,), at = _unpack("I", blob, at), at + 4
            if not cells:
                continue
            cells_at = at
            for _ in range(cells):
                (_, n_seq), at = _unpack("iI", blob, at), at + 8
                at += 4 * n_seq
            flag_at = at
            (trans, n_layer), at = _unpack("II", blob, at), at + 8
            for _ in range(n_layer):
                (_, row), at = _unpack("iQ", blob, at), at + 12
                at += cells * row
            v_start = at
            for _ in range(n_layer):
                if trans:
                    (_, el, ch), at = _unpack("iII", blob, at), at + 12
                    at += cells * el * ch
                else:
                    (_, row), at = _unpack("iQ", blob, at), at + 12
                    at += cells * row
            out.append(Stream(cells_at, flag_at, v_start, at, cells, n_layer, bool(trans)))
    if at != len(blob) or not out:
        raise BackendError(f"llama.cpp KV state of {len(blob)} bytes parsed to byte {at}: not a layout this "
                           "version of Nexus can read")
    return out


def _transpose_v(blob: bytes, st: Stream) -> bytes:
    """The V part of stream `st` in the other layout."""
    out, at, cells = [], st.v_start, st.cells
    for _ in range(st.n_layer):
        if st.transposed:  # (channels, cells) elements -> (cells, channels)
            vtype, el, ch = _unpack("iII", blob, at)
            data = np.frombuffer(blob, f"V{el}", cells * ch, at + 12).reshape(ch, cells)
            out += [struct.pack("<iQ", vtype, el * ch), data.T.tobytes()]
            at += 12 + cells * el * ch
        else:
            vtype, row = _unpack("iQ", blob, at)
            el = ELEMENT_BYTES.get(vtype)
            if el is None:
                raise BackendError(f"a llama.cpp V cache of ggml type {vtype} cannot be stored transposed "
                                   "(only F32, F16 and BF16 can; a quantized V cache needs flash attention)")
            data = np.frombuffer(blob, f"V{el}", cells * row // el, at + 12).reshape(cells, row // el)
            out += [struct.pack("<iII", vtype, el, row // el), data.T.tobytes()]
            at += 12 + cells * row
    return b"".join(out)


def set_v_layout(blob: bytes, transposed: bool) -> bytes:
    """The same state with every stream's V stored transposed (`transposed`) or per cell: a copy of the same
    elements in the other order, so logits after an import are the ones the original layout gives. Raises
    BackendError if the state cannot be read or its V type cannot be transposed."""
    parts, last = [], 0
    for st in read_streams(blob):
        if st.transposed == transposed:
            continue
        parts += [blob[last:st.flag_at], struct.pack("<I", int(transposed)), blob[st.flag_at + 4 : st.v_start],
                  _transpose_v(blob, st)]
        last = st.v_end
    return b"".join(parts) + blob[last:]


@dataclass(frozen=True)
class Rope:
    """How a model rotates its keys, as `native.models.rope.Rope` describes it (which rotates MLX arrays, and
    `shift` is this module's `_rotate`): the first `dims` channels of each `head_dim`-channel head, in pairs
    (2i, 2i+1) (`traditional`, llama.cpp's NORM) or (i, i + dims/2) (NEOX), at angles pos * base^(-2i/dims). In
    numpy here: the llama.cpp path never imports MLX (its import loads OpenBLAS and PyTorch, `native.blas`)."""

    head_dim: int
    dims: int
    base: float
    traditional: bool


def _as_f32(blob: bytes, at: int, n: int, ktype: int) -> np.ndarray:
    if ktype == _BF16:
        return (np.frombuffer(blob, "<u2", n, at).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(blob, "<f4" if ktype == _F32 else "<f2", n, at).astype(np.float32)


def _from_f32(x: np.ndarray, ktype: int) -> bytes:
    if ktype == _F32:
        return x.astype("<f4").tobytes()
    if ktype == _F16:
        return x.astype("<f2").tobytes()
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()  # round to nearest even, like ggml


def _rotate(x: np.ndarray, delta: int, rope: Rope) -> np.ndarray:
    """Keys x (cells, heads, head_dim) as if computed `delta` positions later (rotations compose)."""
    half, d = rope.dims // 2, rope.dims
    theta = delta * rope.base ** (-2.0 * np.arange(half, dtype=np.float64) / d)
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    out = x.copy()
    first, second = (slice(0, d, 2), slice(1, d, 2)) if rope.traditional else (slice(0, half), slice(half, d))
    a, b = x[..., first], x[..., second]
    out[..., first], out[..., second] = a * cos - b * sin, a * sin + b * cos
    return out


def move_keys(blob: bytes, delta: int, rope: Rope) -> bytes:
    """The same state `delta` positions later: every cell's position plus delta, every key rotated by delta.

    What llama.cpp's K-shift does to the imported cells, done before the import. Raises BackendError for a
    state it cannot read or a key type it cannot rotate (quantized K caches)."""
    parts, last = [], 0
    for st in read_streams(blob):
        parts.append(blob[last : st.cells_at])
        at = st.cells_at
        for _ in range(st.cells):
            pos, n_seq = _unpack("iI", blob, at)
            parts += [struct.pack("<i", pos + delta), blob[at + 4 : at + 8 + 4 * n_seq]]
            at += 8 + 4 * n_seq
        parts.append(blob[at : at + 8])  # v_trans, layers
        at += 8
        for _ in range(st.n_layer):
            ktype, row = _unpack("iQ", blob, at)
            el = ELEMENT_BYTES.get(ktype)
            if el is None or row % (el * rope.head_dim):
                raise BackendError(f"keys of ggml type {ktype} ({row}-byte rows) cannot be rotated here "
                                   f"(F32, F16 and BF16 rows of {rope.head_dim}-channel heads can)")
            x = _as_f32(blob, at + 12, st.cells * row // el, ktype).reshape(st.cells, -1, rope.head_dim)
            parts += [blob[at : at + 12], _from_f32(_rotate(x, delta, rope), ktype)]
            at += 12 + st.cells * row
        last = st.v_start  # V carries no position
    return b"".join(parts) + blob[last:]
