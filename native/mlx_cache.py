"""The MLX KV cache: keys (post-RoPE), values, their absolute positions and per-key logit biases.

Keys are rotated at their absolute positions when written, so dropping some keys never changes the others and
a recalled key needs no re-rotation. The cache builds the attention mask from positions (a query at position p
sees keys at positions <= p) plus the additive bias; while no bias is set and every cached key precedes the new
tokens (slot order need not match position order) that mask is the bottom-right "causal" one and no array is
built; with a bias, a one-token decode step reuses the bias row kept in MLX between steps. A sliding-window
layer (Gemma 3's local layers) keeps every key too and masks those `window` or more positions behind the
query, so eviction, splicing and recall treat all layers alike; a spliced block older than the window is simply
invisible to the local layers, as it would be had it been prefilled there.
Shapes: Hkv key/value heads, S used slots, D head dim, L layers.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
import numpy as np

from native.models.attention import visible

_STEP = 256  # capacity grows in slots of this many tokens
QueryHook = Callable[[int, mx.array, np.ndarray], None]  # (layer, q (B, H, T, D), query positions (T,))


class LayerKV:
    """One layer's cache. `positions` (S,) and `bias` (Hkv, S) describe the used slots."""

    def __init__(self, index: int, n_heads: int, n_kv_heads: int, head_dim: int, owner: "KVCache", window: int = 0):
        self.index, self.n_heads, self.n_kv_heads, self.head_dim = index, n_heads, n_kv_heads, head_dim
        self.window = window  # 0: global attention
        self.owner = owner
        self.keys: mx.array | None = None  # (1, Hkv, capacity, D)
        self.values: mx.array | None = None
        self.length = 0
        self.positions = np.zeros(0, dtype=np.int64)
        self._bias: np.ndarray | None = None  # (Hkv, S) float32, additive logit bias; None = all zero
        self._bias_row: mx.array | None = None  # (1, H, 1, capacity) the bias per query head, zero past length

    @property
    def bias(self) -> np.ndarray | None:
        return self._bias

    @bias.setter
    def bias(self, bias: np.ndarray | None) -> None:
        self._bias, self._bias_row = bias, None

    # -- storage -------------------------------------------------------------------------------------------
    def _reserve(self, n_new: int, dtype) -> None:
        need = self.length + n_new
        cap = 0 if self.keys is None else self.keys.shape[2]
        if need <= cap:
            return
        new_cap = (need + _STEP - 1) // _STEP * _STEP
        self._bias_row = None  # sized to the capacity
        shape = (1, self.n_kv_heads, new_cap, self.head_dim)
        k, v = mx.zeros(shape, dtype), mx.zeros(shape, dtype)
        if self.length:
            k[..., : self.length, :] = self.keys[..., : self.length, :]
            v[..., : self.length, :] = self.values[..., : self.length, :]
        self.keys, self.values = k, v

    def append(self, k: mx.array, v: mx.array, positions: np.ndarray, bias: np.ndarray | None = None) -> None:
        """Write (1, Hkv, T, D) keys/values at the next T slots with the given absolute positions."""
        t = k.shape[2]
        self._reserve(t, k.dtype)
        self.keys[..., self.length : self.length + t, :] = k
        self.values[..., self.length : self.length + t, :] = v
        if bias is not None or self._bias is not None:
            old = self._bias if self._bias is not None else np.zeros((self.n_kv_heads, self.length), np.float32)
            new = bias if bias is not None else np.zeros((self.n_kv_heads, t), np.float32)
            self._bias = np.concatenate([old, new.astype(np.float32)], axis=1)
            if bias is not None:  # the cached row holds zeros past the old length
                self._bias_row = None
        self.positions = np.concatenate([self.positions, np.asarray(positions, dtype=np.int64)])
        self.length += t

    def keep(self, slots: np.ndarray, idx: mx.array | None = None) -> None:
        """Compact the cache to the given slot indices (in order); memory shrinks to fit. Lazy: the new storage
        is computed at the next `mx.eval` (`KVCache.keep` evaluates all layers at once)."""
        slots = np.asarray(slots, dtype=np.int64)
        idx = mx.array(slots.astype(np.int32)) if idx is None else idx
        positions = self.positions[slots]
        bias = None if self.bias is None else self.bias[:, slots]
        if not len(slots):
            self.keys = self.values = self.bias = None
            self.length, self.positions = 0, np.zeros(0, dtype=np.int64)
            return
        # New storage sized to what is kept (rounded up to the growth step): memory really shrinks.
        pad = (len(slots) + _STEP - 1) // _STEP * _STEP - len(slots)
        zeros = mx.zeros((1, self.n_kv_heads, pad, self.head_dim), self.keys.dtype)
        self.keys = mx.concatenate([mx.take(self.keys[..., : self.length, :], idx, axis=2), zeros], axis=2)
        self.values = mx.concatenate([mx.take(self.values[..., : self.length, :], idx, axis=2), zeros], axis=2)
        self.length, self.positions, self.bias = len(slots), positions, bias

    def truncate(self, n: int) -> None:
        """Drop the slots from n on (a rewind); the storage stays allocated for the next append."""
        self.length, self.positions = n, self.positions[:n]
        if self.bias is not None:
            self.bias = self.bias[:, :n]

    def view(self) -> tuple[mx.array, mx.array]:
        return self.keys[..., : self.length, :], self.values[..., : self.length, :]

    # -- attention -----------------------------------------------------------------------------------------
    def update_and_fetch(self, k: mx.array, v: mx.array, q: mx.array, offset: int):
        """Store new (B, Hkv, T, D) keys/values at positions offset..; return all keys, values and the mask."""
        t = k.shape[2]
        qpos = np.arange(offset, offset + t, dtype=np.int64)
        # Every cached key precedes the new tokens (always so after eviction or recall, which keep earlier
        # positions only): the position mask is then exactly the bottom-right "causal" one (None for one query).
        in_order = self.length == 0 or int(self.positions.max()) < offset
        if self.window and in_order:  # the causal mask holds only if every query's window covers every key
            first = int(self.positions.min()) if self.length else offset
            in_order = offset + t - 1 - first < self.window
        self.append(k, v, qpos)
        if self.owner.query_hook is not None:
            self.owner.query_hook(self.index, q, qpos)
        keys, values = self.view()
        if in_order and self._bias is None:
            return keys, values, ("causal" if t > 1 else None)
        if in_order and t == 1:  # one decode step sees every key: its mask is the bias alone
            return keys, values, self.bias_row()
        return keys, values, self.mask(qpos)

    def bias_row(self) -> mx.array:
        """The bias as an additive mask (1, H, 1, S) for a query that sees every cached key; kept between decode
        steps (new slots are zero), so a decode step with Hájek offsets builds no array."""
        if self._bias_row is None:
            row = np.zeros((self.n_heads, self.keys.shape[2]), np.float32)
            row[:, : self.length] = np.repeat(self._bias, self.n_heads // self.n_kv_heads, axis=0)
            self._bias_row = mx.array(row[None, :, None, :])
        return self._bias_row[..., : self.length]

    def mask(self, qpos: np.ndarray) -> mx.array:
        """Additive float mask (1, H or 1, T, S): 0 where the query sees the key (`visible`), -inf elsewhere, + bias."""
        allowed = visible(qpos, self.positions, self.window)  # (T, S)
        m = np.where(allowed, 0.0, -np.inf).astype(np.float32)[None, None]  # (1, 1, T, S)
        if self.bias is not None:
            group = self.n_heads // self.n_kv_heads
            per_head = np.repeat(self.bias, group, axis=0)  # (H, S)
            m = m + per_head[None, :, None, :]
        return mx.array(m)

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return 2 * self.length * self.n_kv_heads * self.head_dim * self.keys.dtype.size


class KVCache:
    """All layers' caches plus an optional hook that sees every layer's queries (eviction scoring)."""

    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, windows: tuple[int, ...] = ()):
        windows = windows or (0,) * n_layers
        self.layers = [LayerKV(i, n_heads, n_kv_heads, head_dim, self, windows[i]) for i in range(n_layers)]
        self.query_hook: QueryHook | None = None

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def positions(self) -> np.ndarray:
        return self.layers[0].positions

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def arrays(self) -> list[mx.array]:
        return [a for layer in self.layers if layer.keys is not None for a in (layer.keys, layer.values)]

    def slots_in(self, start: int, end: int) -> np.ndarray:
        pos = self.positions
        return np.nonzero((pos >= start) & (pos < end))[0]

    def keep(self, slots: np.ndarray) -> None:
        idx = mx.array(np.asarray(slots, dtype=np.int32))
        for layer in self.layers:
            layer.keep(slots, idx)
        mx.eval(*self.arrays())  # one evaluation for all layers, not one per layer

    def truncate(self, n: int) -> None:
        for layer in self.layers:
            layer.truncate(n)

    def export(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of the given slots as (L, Hkv, T, D) float32 NumPy arrays."""
        idx = mx.array(np.asarray(slots, dtype=np.int32))
        ks, vs = [], []
        for layer in self.layers:
            k, v = layer.view()
            ks.append(mx.take(k[0], idx, axis=1))
            vs.append(mx.take(v[0], idx, axis=1))
        k, v = mx.stack(ks), mx.stack(vs)
        return np.array(k.astype(mx.float32)), np.array(v.astype(mx.float32))

    def insert(self, keys: mx.array, values: mx.array, positions: np.ndarray) -> None:
        """Append (L, Hkv, T, D) keys (post-RoPE at `positions`) and values to every layer."""
        for i, layer in enumerate(self.layers):
            layer.append(keys[i][None], values[i][None], positions)
        mx.eval(*self.arrays())
