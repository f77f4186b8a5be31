"""The buffer file: INT8 tool embeddings opened with numpy.memmap.

Layout (little endian), all sections 64-byte aligned (format version 2):
    b"NXSLB\\x00" + u16 format version | u64 header length | JSON header | [float32 rotation (dim, dim)] |
    int8 lead (rows, coarse_dim) | int8 tail (rows, dim - coarse_dim) | float32 scales (rows,) |
    [int32 row_tool (rows,)]
The JSON header holds model_id, dim, count (tools), version, coarse_dim, tool names, schema hashes, section
offsets and the calibration (tau, score floor) written by `slb calibrate`. A buffer with several rows per tool
(the tool text plus example requests) also holds `rows`, `row_keys` (one content key per row, for reuse on
rebuild) and the row_tool section (tool index of each row, rows of a tool contiguous); without them there is
one row per tool (rows = count). `duplicates` lists near-duplicate tool pairs [a, b, cosine] (slb.duplicates).
Row i = [lead[i] | tail[i]] and
row i * scales[i] ≈ R @ x_i, x_i the L2-normalized embedding of row i (symmetric per-row quantization:
scale = max|y| / 127). Small buffers have no rotation (R = I, coarse_dim = dim, empty tail: single-pass
scan); large ones (>= slb.twostage.TWO_STAGE_MIN_ROWS rows) store a PCA rotation and split the rows so the
two-stage scan reads only the contiguous lead block in its first stage (see slb/twostage.py, slb/index.py).
Version 1 files (no rotation, one matrix) are rejected with a request to rebuild.
Writes go to a temp file in the same folder, are fsynced, then renamed over the old file (atomic); the header's
`checksum` (blake2b-128 over the header without it and both sections) is verified on open.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from registry.atomic import write_atomic

MAGIC = b"NXSLB\x00"
FORMAT_VERSION = 2
_ALIGN = 64
_HEADER_KEYS = {"model_id", "dim", "count", "names", "hashes", "coarse_dim", "lead_offset", "tail_offset",
                "scales_offset"}


class BufferMismatchError(ValueError):
    """The buffer on disk was built by another embedder (model/recipe/dimension) or format version."""


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, D) float -> (int8 (N, D), float32 scales (N,)) with x[i] ≈ q[i] * scale[i], |q| <= 127."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=1) if x.size else np.zeros(len(x), np.float32)
    scales = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(x / scales[:, None]), -127, 127).astype(np.int8)
    return q, scales


def _pad(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass
class BufferData:
    """In-memory content of a buffer file. m8 (R, D) int8 rows in the stored basis, scales (R,) float32,
    names/hashes length T (tools); rotation (D, D) float32 (rows stored as R @ x) or None; coarse_dim: width
    of the lead block (D when rotation is None); row_tool (R,) int32 tool index of each row and row_keys (R,)
    content keys, both None when R == T (one row per tool)."""

    model_id: str
    dim: int
    names: list[str]
    hashes: list[str]
    m8: np.ndarray
    scales: np.ndarray
    calibration: dict = field(default_factory=dict)
    rotation: np.ndarray | None = None
    coarse_dim: int = 0
    row_tool: np.ndarray | None = None
    row_keys: list[str] | None = None
    duplicates: list | None = None  # [(a, b, cosine)] near-duplicate tool pairs (slb.duplicates), None: unknown

    def __post_init__(self) -> None:
        from slb.scan import check_row_tool

        t = len(self.names)
        n = t if self.row_tool is None else len(self.row_tool)
        if self.row_tool is not None:
            self.row_tool = np.ascontiguousarray(self.row_tool, np.int32)
            if check_row_tool(self.row_tool, n) != t:
                raise ValueError(f"row_tool names {check_row_tool(self.row_tool, n)} tools, the buffer has {t}")
            if self.row_keys is None or len(self.row_keys) != n:
                raise ValueError("a buffer with row_tool needs one row key per row")
        if self.rotation is None:
            self.coarse_dim = self.dim
        elif self.rotation.shape != (self.dim, self.dim) or not 0 < self.coarse_dim < self.dim:
            raise ValueError(f"rotation must be ({self.dim}, {self.dim}) with 0 < coarse_dim < {self.dim}, "
                             f"got {self.rotation.shape} and {self.coarse_dim}")
        if self.m8.shape != (n, self.dim) or self.m8.dtype != np.int8:
            raise ValueError(f"m8 must be ({n}, {self.dim}) int8, got {self.m8.shape} {self.m8.dtype}")
        if self.scales.shape != (n,) or len(self.hashes) != t:
            raise ValueError("scales need one entry per row, names and hashes one per tool")
        if len(set(self.names)) != t:
            raise ValueError("tool names in a buffer must be unique")


def _digest(header: dict, *sections: bytes | memoryview) -> str:
    """blake2b-128 over the header (without its checksum) and every section: any flipped bit is caught."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({k: v for k, v in header.items() if k != "checksum"}, sort_keys=True).encode())
    for sec in sections:
        h.update(sec)
    return h.hexdigest()


def write_buffer(path: str | Path, data: BufferData) -> Path:
    """Write `data` atomically (temp + fsync + rename) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n, d, kc = len(data.names), data.dim, data.coarse_dim
    header = {
        "version": FORMAT_VERSION, "model_id": data.model_id, "dim": d, "count": n, "coarse_dim": kc,
        "names": data.names, "hashes": data.hashes, "calibration": data.calibration,
    }
    if data.row_tool is not None:
        header.update(rows=len(data.row_tool), row_keys=data.row_keys)
    if data.duplicates is not None:
        header["duplicates"] = [[int(a), int(b), round(float(c), 4)] for a, b, c in data.duplicates]
    rot = b"" if data.rotation is None else np.ascontiguousarray(data.rotation, "<f4").tobytes()
    m8 = np.asarray(data.m8, np.int8)
    sections = {"rotation_offset": rot, "lead_offset": np.ascontiguousarray(m8[:, :kc]).tobytes(),
                "tail_offset": np.ascontiguousarray(m8[:, kc:]).tobytes(),
                "scales_offset": np.ascontiguousarray(data.scales, "<f4").tobytes()}
    if data.row_tool is not None:
        sections["row_tool_offset"] = np.ascontiguousarray(data.row_tool, "<i4").tobytes()
    # Offsets depend on the header length, which depends on the offsets' digits: fix them in two passes.
    header.update(dict.fromkeys(sections, 0))
    header["checksum"] = "0" * 32  # placeholder of the final length
    for _ in range(2):
        blob = json.dumps(header, separators=(",", ":")).encode()
        off = _pad(len(MAGIC) + 2 + 8 + len(blob) + 64)
        for key, sec in sections.items():
            header[key], off = off, _pad(off + len(sec))
    header["checksum"] = _digest(header, *sections.values())  # fixed length: the offsets stay valid
    blob = json.dumps(header, separators=(",", ":")).encode()
    assert len(MAGIC) + 10 + len(blob) <= header["rotation_offset"]

    def _write(f) -> None:
        f.write(MAGIC + struct.pack("<HQ", FORMAT_VERSION, len(blob)) + blob)
        for key, sec in sections.items():
            f.seek(header[key])
            f.write(sec)

    write_atomic(path, _write)
    return path


def read_header(path: str | Path) -> dict:
    """The JSON header of a buffer file; raises BufferMismatchError on a foreign or newer file."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 10)
        if len(head) < len(MAGIC) + 10 or head[: len(MAGIC)] != MAGIC:
            raise BufferMismatchError(f"{path} is not an SLB buffer file; delete it and run `nexus slb build`")
        version, hlen = struct.unpack("<HQ", head[len(MAGIC):])
        if version != FORMAT_VERSION:
            raise BufferMismatchError(
                f"{path} has buffer format version {version}, this Nexus reads {FORMAT_VERSION}: run `nexus slb build`"
            )
        size = path.stat().st_size
        text = f.read(hlen) if hlen <= size else b""  # a garbled length must not allocate gigabytes
    try:
        header = json.loads(text) if text and len(text) == hlen else None
    except ValueError:
        header = None
    if not _header_ok(header):
        raise BufferMismatchError(f"{path} has a truncated or unreadable header: delete it and run `nexus slb build`")
    need = max(header[k] + nbytes(header) for k, nbytes in _SECTIONS.items() if k in header) if _rows(header) else 0
    if size < need:
        raise BufferMismatchError(f"{path} is {size} bytes but its header needs {need} (truncated): "
                                  "run `nexus slb build`")
    return header


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _rows(h: dict) -> int:
    """Rows in the file: `rows` when the buffer holds several per tool, else one per tool (`count`)."""
    return h.get("rows", h["count"])


# bytes of each section a header may name, by its offset key (a garbled offset or count must not reach memmap)
_SECTIONS = {
    "m8_offset": lambda h: _rows(h) * h["dim"],
    "rotation_offset": lambda h: 4 * h["dim"] * h["dim"] if h.get("coarse_dim", h["dim"]) < h["dim"] else 0,
    "lead_offset": lambda h: _rows(h) * h.get("coarse_dim", h["dim"]),
    "tail_offset": lambda h: _rows(h) * (h["dim"] - h.get("coarse_dim", h["dim"])),
    "scales_offset": lambda h: 4 * _rows(h),
    "row_tool_offset": lambda h: 4 * _rows(h),
}


def _header_ok(h) -> bool:
    """A dict with every key, non-negative integer sizes and offsets, and one name and hash per row."""
    if not isinstance(h, dict) or not _HEADER_KEYS <= h.keys():
        return False
    ints = [k for k in h if k in _SECTIONS or k in ("dim", "count", "coarse_dim", "rows")]
    if not all(_is_count(h[k]) for k in ints) or h.get("coarse_dim", 0) > h["dim"]:
        return False
    if ("rows" in h) != ("row_tool_offset" in h) or ("rows" in h and not (
            isinstance(h.get("row_keys"), list) and len(h["row_keys"]) == h["rows"])):
        return False
    return all(isinstance(h[k], list) and len(h[k]) == h["count"] and all(isinstance(x, str) for x in h[k])
               for k in ("names", "hashes")) and isinstance(h["model_id"], str)


class SLBuffer:
    """A buffer file opened read-only with numpy.memmap: `index` (slb.index.ScanIndex over the memmapped
    lead/tail blocks, with the rotation if any), `scales` (N,) float32, `names`."""

    def __init__(self, path: str | Path, model_id: str | None = None, dim: int | None = None):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no SLB buffer at {self.path}: run `nexus slb build` first")
        self.header = read_header(self.path)
        h = self.header
        if model_id is not None and h["model_id"] != model_id:
            raise BufferMismatchError(
                f"{self.path} was built with embedder {h['model_id']!r} but the router uses {model_id!r}: "
                "rebuild it with `nexus slb build` (or select the matching embedder/recipe)"
            )
        if dim is not None and h["dim"] != dim:
            raise BufferMismatchError(f"{self.path} holds {h['dim']}-d rows but the embedder makes {dim}-d vectors: "
                                      "rebuild it with `nexus slb build`")
        n, d, kc = _rows(h), h["dim"], h["coarse_dim"]

        def _map(dtype, key, shape):  # plain ndarray views of the maps: Numba takes ndarray, not memmap
            if not np.prod(shape):
                return np.zeros(shape, dtype)
            return np.asarray(np.memmap(self.path, dtype, "r", offset=h[key], shape=shape))

        rot = _map("<f4", "rotation_offset", (d, d)) if kc < d else None
        lead, tail = _map(np.int8, "lead_offset", (n, kc)), _map(np.int8, "tail_offset", (n, d - kc))
        self.scales = _map("<f4", "scales_offset", (n,))
        row_tool = _map("<i4", "row_tool_offset", (n,)) if "rows" in h else None
        if _digest(h, b"" if rot is None else rot.tobytes(), lead.tobytes(), tail.tobytes(), self.scales.tobytes(),
                   *(() if row_tool is None else (row_tool.tobytes(),))) != h.get("checksum"):
            raise BufferMismatchError(f"{self.path}: checksum mismatch (corrupted buffer): "
                                      "delete it and run `nexus slb build`")
        from slb.index import ScanIndex  # slb.index imports the Numba kernels: only when a buffer is opened

        try:
            self.index = ScanIndex(lead, np.asarray(self.scales, np.float32), tail, rot,
                                   row_tool=None if row_tool is None else np.asarray(row_tool, np.int32))
        except ValueError as e:
            raise BufferMismatchError(f"{self.path}: {e}") from None
        if len(self.index) != h["count"]:
            raise BufferMismatchError(f"{self.path}: rows name {len(self.index)} tools, the header "
                                      f"{h['count']}: run `nexus slb build`")
        self.row_keys: list[str] | None = h.get("row_keys")
        dups = h.get("duplicates")
        ok = isinstance(dups, list) and all(isinstance(p, list) and len(p) == 3 and all(
            _is_count(v) and v < h["count"] for v in p[:2]) for p in dups)
        self.duplicates: list | None = [tuple(p) for p in dups] if ok else None
        self.names: list[str] = h["names"]
        self.hashes: list[str] = h["hashes"]

    @property
    def model_id(self) -> str:
        return self.header["model_id"]

    @property
    def calibration(self) -> dict:
        return dict(self.header.get("calibration") or {})

    def __len__(self) -> int:
        return len(self.names)

    @property
    def m8(self) -> np.ndarray:
        """(R, D) int8 rows in the stored basis (rotated for two-stage buffers: scan them with `index`)."""
        return self.index.rows()

    def data(self) -> BufferData:
        """A writable in-memory copy (for rebuilds and calibration updates)."""
        ix = self.index
        rot = None if ix.rotation is None else np.array(ix.rotation)
        return BufferData(self.model_id, self.header["dim"], list(self.names), list(self.hashes),
                          np.array(ix.rows()), np.array(self.scales, np.float32), self.calibration, rot,
                          self.header["coarse_dim"], None if ix.row_tool is None else np.array(ix.row_tool),
                          None if self.row_keys is None else list(self.row_keys), self.duplicates)
