"""Selective K/V recomputation in place (CacheBlend, Yao et al. 2024): fix the spliced tokens that deviate most.

A spliced block's K/V were computed without the context now before it. Layer-0 K/V depend only on the token
and its position, so they are already right; layer-0 *outputs* are not. `select_deviating` runs layer 0 over
the block in context (keys: the whole cache, mask by position), projects layer-1 K/V from those fresh hidden
states, and ranks the block's tokens by their squared distance to the stored layer-1 K/V. `recompute_slots`
then runs the chosen tokens through layers 1..L-1 at their own positions, each layer attending to the whole
cache with the chosen tokens' fresh K/V written into their slots first; the other block tokens keep their
spliced K/V. Shapes: T block tokens, R chosen, S cached slots, H query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from native.mlx_cache import KVCache, LayerKV


def rope_at(x: mx.array, positions: np.ndarray, args) -> mx.array:
    """Rotate (1, H, T, D) by arbitrary per-token positions (T,): one rope "batch" row per token."""
    xt = x.transpose(2, 1, 0, 3)  # (T, H, 1, D)
    out = mx.fast.rope(xt, args.head_dim, traditional=args.rope_traditional, base=args.rope_base, scale=1.0,
                       offset=mx.array(np.asarray(positions, dtype=np.int32)))
    return out.transpose(2, 1, 0, 3)


def _qkv(layer, h: mx.array, positions: np.ndarray, args):
    """Rotated q (1, H, T, D), k and v (1, Hkv, T, D) of hidden states h (1, T, d_model) at `positions`."""
    a, x = layer.self_attn, layer.input_layernorm(h)
    T = h.shape[1]
    q = a.q_proj(x).reshape(1, T, args.n_heads, args.head_dim).transpose(0, 2, 1, 3)
    k = a.k_proj(x).reshape(1, T, args.n_kv_heads, args.head_dim).transpose(0, 2, 1, 3)
    v = a.v_proj(x).reshape(1, T, args.n_kv_heads, args.head_dim).transpose(0, 2, 1, 3)
    return rope_at(q, positions, args), rope_at(k, positions, args), v


def _layer_at(layer, lc: LayerKV, h: mx.array, positions: np.ndarray, slots: np.ndarray | None, args) -> mx.array:
    """One transformer block for tokens already cached at `slots`; writes their fresh K/V there unless None."""
    q, k, v = _qkv(layer, h, positions, args)
    if slots is not None:
        idx = mx.array(slots.astype(np.int32))
        lc.keys[:, :, idx, :] = k
        lc.values[:, :, idx, :] = v
    keys, values = lc.view()
    out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=args.head_dim**-0.5, mask=lc.mask(positions))
    h = h + layer.self_attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, h.shape[1], -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def select_deviating(model, cache: KVCache, tokens: list[int], slots: np.ndarray, frac: float):
    """Rank block tokens at cache `slots` by layer-1 K/V deviation; return (chosen slot indices ascending,
    their layer-0 outputs (1, R, d_model), deviation per block token (T,) float32)."""
    args, layers = model.args, model.model.layers
    positions = cache.positions[slots]
    h1 = _layer_at(layers[0], cache.layers[0], model.model.embed_tokens(mx.array(tokens, dtype=mx.int32)[None]),
                   positions, None, args)  # layer-0 K/V are context-free: the stored ones are right
    _, k, v = _qkv(layers[1], h1, positions, args)
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
    args, positions = model.args, cache.positions[slots]
    h = h1
    for layer, lc in zip(model.model.layers[1:], cache.layers[1:]):
        h = _layer_at(layer, lc, h, positions, slots, args)
    mx.eval(*cache.arrays())
