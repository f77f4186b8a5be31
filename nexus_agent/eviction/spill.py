"""The disk tier: evicted tokens' K/V in an append-only, mmap-able spill file, recalled bit for bit.

File layout: consecutive fixed-size records, one per evicted token, each (2, L, Hkv, D) in the cache dtype
(keys post-RoPE at the token's original position, then values). Positions and token ids stay in memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class SpillFile:
    """Append evicted tokens; `read` memory-maps the file and gathers records by position."""

    def __init__(self, path: str | Path, n_layers: int, n_kv_heads: int, head_dim: int, dtype=np.float32):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")
        self.shape = (2, n_layers, n_kv_heads, head_dim)
        self.dtype = np.dtype(dtype)
        self.positions = np.zeros(0, dtype=np.int64)
        self.tokens = np.zeros(0, dtype=np.int64)
        self.recalled = np.zeros(0, dtype=bool)

    def __len__(self) -> int:
        return len(self.positions)

    def write(self, positions: np.ndarray, tokens: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        """positions/tokens (T,), keys/values (L, Hkv, T, D) -> T records appended to the file.

        A recalled token that is evicted again keeps its one record: its K/V in the cache are the bytes read
        from that record, so it is only marked as on disk again (a second record would let a later recall put
        the same position into the cache twice)."""
        positions = np.asarray(positions, np.int64)
        again = self.recalled & np.isin(self.positions, positions)
        self.recalled[again] = False
        new = ~np.isin(positions, self.positions[again])
        if not new.any():
            return
        rec = np.stack([keys, values]).transpose(3, 0, 1, 2, 4)[new].astype(self.dtype, copy=False)  # (T, 2, L, Hkv, D)
        with open(self.path, "ab") as f:
            f.write(np.ascontiguousarray(rec).tobytes())
        self.positions = np.concatenate([self.positions, positions[new]])
        self.tokens = np.concatenate([self.tokens, np.asarray(tokens, np.int64)[new]])
        self.recalled = np.concatenate([self.recalled, np.zeros(int(new.sum()), dtype=bool)])

    def available(self) -> np.ndarray:
        """Positions on disk that are not currently recalled into the cache."""
        return self.positions[~self.recalled]

    def _index(self, positions: np.ndarray) -> np.ndarray:
        lookup = {int(p): i for i, p in enumerate(self.positions) if not self.recalled[i]}
        try:
            return np.array([lookup[int(p)] for p in positions], dtype=np.int64)
        except KeyError as e:
            raise ValueError(f"position {e.args[0]} is not in the spill file {self.path}") from None

    def _records(self, idx: np.ndarray) -> np.ndarray:
        mm = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(len(self.positions), *self.shape))
        rec = np.array(mm[idx])  # (T, 2, L, Hkv, D)
        del mm
        return rec

    def keys(self, positions: np.ndarray) -> np.ndarray:
        """Keys of spilled `positions` (T,) as (L, Hkv, T, D), without recalling them (for ranking)."""
        return self._records(self._index(positions))[:, 0].transpose(1, 2, 0, 3)

    def release(self, positions: np.ndarray) -> None:
        """Mark recalled `positions` as on disk again (their bytes never left the file)."""
        want = set(np.asarray(positions).tolist())
        for i in np.nonzero(self.recalled)[0]:
            if int(self.positions[i]) in want:
                self.recalled[i] = False

    def read(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Records for `positions` (T,) -> keys, values (L, Hkv, T, D) and tokens (T,); marks them recalled."""
        idx = self._index(positions)
        rec = self._records(idx)
        self.recalled[idx] = True
        kv = rec.transpose(1, 2, 3, 0, 4)  # (2, L, Hkv, T, D)
        return kv[0], kv[1], self.tokens[idx]
