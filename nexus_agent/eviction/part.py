"""`Part`: a piece of an evicting session that reacts to its events (H2O history, certifier, disk tier).

`EvictingSession` owns the hook, the per-slot π and the compaction; each part keeps its own per-slot state
aligned through `sync` (slots appended) and `compact` (slots kept), and sees the queries and the evictions.
Every method is a no-op by default, so a part implements only the events it needs.
Shapes: L layers, H query heads, Hkv KV heads, S cached slots, T new tokens, D head dim.
"""

from __future__ import annotations

import numpy as np


class Part:
    """Base of the session parts; `session` is set by `EvictingSession` when the part is attached."""

    session = None

    def sync(self, n: int) -> None:
        """The cache now holds `n` slots; the new ones were appended after the previous count."""

    def on_query(self, layer: int, q, qpos: np.ndarray) -> None:
        """Layer `layer` attends with queries q (1, H, T, D) (an mx.array) at positions qpos (T,); the cache
        already holds their keys."""

    def on_evict(self, gone: np.ndarray) -> None:
        """Slots `gone` (E,) are about to leave the cache (their K/V are still readable)."""

    def compact(self, slots: np.ndarray) -> None:
        """Only `slots` (S',) remain, in this order."""
