"""llama.cpp's per-sequence KV state, read far enough to move its V cache between the two layouts.

Without flash attention llama.cpp stores V transposed (one row per channel, a column per cell) and its
sequence state keeps that layout; with flash attention V rows are per cell like K. A state saved in one layout
is refused by a context in the other, so `set_v_layout` rewrites the V part: the same numbers, transposed.
The state (`llama_state_seq_get_data`, llama.cpp as packaged by llama-cpp-python 0.3.x): a u32 magic and a u32
version, then per KV cache (one, or two for a sliding-window model: global then local) a u32 stream count and
per stream: u32 cells, per cell (i32 position, u32 n, n x i32 sequence ids), u32 v_trans, u32 layers, per layer
K (i32 type, u64 row bytes, cells x row), then per layer V either like K or, transposed, (i32 type, u32 element
bytes, u32 channels, channels x cells elements). Anything else raises `BackendError` naming what was found.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from native.base import BackendError

ELEMENT_BYTES = {0: 4, 1: 2, 30: 2}  # ggml types V can be transposed in: F32, F16, BF16 (quantized V needs FA)
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
            out.append(Stream(flag_at, v_start, at, cells, n_layer, bool(trans)))
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
