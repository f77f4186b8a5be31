"""Selective K/V recomputation in place (CacheBlend, Yao et al. 2024): fix the spliced tokens that deviate most.

A spliced block's K/V were computed without the context now before it. Layer-0 K/V depend only on the token
and its position, so they are already right; layer-0 *outputs* are not. `select_deviating` runs layer 0 over
the block in context (keys: the whole cache, mask by position), projects layer-1 K/V from those fresh hidden
states, and ranks the block's tokens by their squared distance to the stored layer-1 K/V. `recompute_slots`
then runs the chosen tokens through layers 1..L-1 at their own positions, each layer attending to the whole
cache with the chosen tokens' fresh K/V written into their slots first; the other block tokens keep their
spliced K/V. Both run the architecture's own blocks (`native.models`) over a `SlotView` of each layer's cache.
Shapes: T block tokens, R chosen, S cached slots, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from native.mlx_cache import KVCache, LayerKV


class SlotView:
    """A layer cache as a block sees it for tokens already cached at `slots`: their fresh K/V are written there
    (unless `slots` is None) and they attend to the whole cache with the position mask of their own positions."""

    def __init__(self, layer: LayerKV, positions: np.ndarray, slots: np.ndarray | None):
        self.layer, self.positions, self.slots = layer, positions, slots

    def update_and_fetch(self, k: mx.array, v: mx.array, q: mx.array, offset):
        if self.slots is not None:
            idx = mx.array(self.slots.astype(np.int32))
            self.layer.keys[:, :, idx, :] = k
            self.layer.values[:, :, idx, :] = v
        keys, values = self.layer.view()
        return keys, values, self.layer.mask(self.positions)


def select_deviating(model, cache: KVCache, tokens: list[int], slots: np.ndarray, frac: float):
    """Rank block tokens at cache `slots` by layer-1 K/V deviation; return (chosen slot indices ascending,
    their layer-0 outputs (1, R, d_model), deviation per block token (T,) float32)."""
    layers, positions = model.layers, cache.positions[slots]
    h0 = model.embed(mx.array(tokens, dtype=mx.int32)[None])
    h1 = layers[0](h0, positions, SlotView(cache.layers[0], positions, None))  # layer-0 K/V are context-free
    _, k, v = layers[1].project(h1, positions)
    idx = mx.array(slots.astype(np.int32))
    lk, lv = cache.layers[1].view()
    dev = (((k - mx.take(lk, idx, axis=2)) ** 2).sum(axis=(0, 1, 3))
           + ((v - mx.take(lv, idx, axis=2)) ** 2).sum(axis=(0, 1, 3)))
    dev = np.array(dev.astype(mx.float32))
    r = min(len(slots), max(1, math.ceil(frac * len(slots))))
    pick = np.sort(np.argsort(-dev, kind="stable")[:r])
    return pick, h1[:, mx.array(pick.astype(np.int32)), :], dev


def recompute_slots(model, cache: KVCache, slots: np.ndarray, h1: mx.array) -> None:
    """Run tokens at `slots` (ascending) from their layer-0 outputs h1 (1, R, d_model) through layers 1..L-1."""
    positions, h = cache.positions[slots], h1
    for layer, lc in zip(model.layers[1:], cache.layers[1:]):
        h = layer(h, positions, SlotView(lc, positions, slots))
    mx.eval(*cache.arrays())
