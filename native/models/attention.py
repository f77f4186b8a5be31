"""The attention formula, once: the runtime call (MLX) and the weights other parts of Nexus read (NumPy).

Every architecture projects its own queries, keys and values, rotates them with its layer's `Rope`, then calls
`attend`: the layer's cache stores the keys at their absolute positions, shows the queries to the query hook
(eviction scoring) and builds the mask (position order, sliding window, additive per-key bias). Eviction scores,
the Hájek certificate, the disk tier and the replay eval compute the same softmax(q·k · scale + mask) through
`attention_weights` with the layer's `scale`, `window` and `softcap` (`native.base.ModelInfo`).
Soft-capped models (Gemma 2) squash every scaled score with `soft_cap` before the mask and the softmax; this
file is the one place that formula lives, so whatever reads attention weights sees the capped ones the model uses.
Shapes: H query heads, Hkv key/value heads (H = g·Hkv), T/W queries, S/N keys, D head dim.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def soft_cap(x, cap: float):
    """cap · tanh(x / cap) (NumPy or MLX arrays): Gemma 2's bound on attention scores and final logits; cap 0: x."""
    if not cap:
        return x
    return cap * (mx.tanh(x / cap) if isinstance(x, mx.array) else np.tanh(x / cap))


def attend(q: mx.array, k: mx.array, v: mx.array, layer_cache, offset, scale: float, softcap: float = 0.0
           ) -> mx.array:
    """Store k, v (B, Hkv, T, D) in `layer_cache` at positions offset.. (or the cache's own slots) and attend
    from q (B, H, T, D) over every cached key: (B, H, T, D). `softcap` > 0 caps the scaled scores first."""
    keys, values, mask = layer_cache.update_and_fetch(k, v, q, offset)
    if not softcap:
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)
    if isinstance(mask, str):  # "causal": the T queries are the last T positions of the S keys
        t, s = q.shape[2], keys.shape[2]
        mask = mx.where(mx.arange(s)[None] <= mx.arange(s - t, s)[:, None], 0.0, -mx.inf)  # (T, S)
    elif mask is not None:
        mask = mask[0]  # (H or 1, T, S)
    w = attention_weights_mx(q[0], keys[0], scale, mask, softcap)  # (H, T, S)
    g = q.shape[1] // keys.shape[1]
    return (w @ mx.repeat(values[0], g, axis=0))[None].astype(q.dtype)


def visible(qpos: np.ndarray, kpos: np.ndarray, window: int = 0) -> np.ndarray:
    """(T, S) bool: a query at position p sees keys at positions <= p, and with a sliding window only those
    with p - position < window (llama.cpp's and Hugging Face's rule)."""
    ok = kpos[None, :] <= qpos[:, None]
    if window:
        ok &= qpos[:, None] - kpos[None, :] < window
    return ok


def attention_logits(q: np.ndarray, k: np.ndarray, scale: float = 0.0, softcap: float = 0.0) -> np.ndarray:
    """Scaled (and with `softcap` > 0 soft-capped) scores (H, W, N) of queries q (H, W, D) against keys k
    (Hkv, N, D); query head h reads KV head h // g; `scale` 0 means D ** -0.5. Per-head 2-D products: a batched
    matmul contends with MLX for BLAS threads."""
    g = q.shape[0] // k.shape[0]
    scores = np.stack([q[h] @ k[h // g].T for h in range(q.shape[0])]) * (scale or q.shape[-1] ** -0.5)
    return soft_cap(scores, softcap)


def attention_weights(q: np.ndarray, k: np.ndarray, scale: float, qpos: np.ndarray, kpos: np.ndarray,
                      window: int = 0, bias: np.ndarray | None = None, softcap: float = 0.0) -> np.ndarray:
    """softmax over keys of soft_cap(q·k · scale) + bias (Hkv, N) with the causal / sliding-window mask:
    (H, W, N), rows sum to 1 (a row that sees no key is all zero)."""
    logits = attention_logits(q, k, scale, softcap)
    if bias is not None:
        logits = logits + np.repeat(bias, q.shape[0] // k.shape[0], axis=0)[:, None, :]
    logits = np.where(visible(qpos, kpos, window)[None], logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    a = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
    total = a.sum(-1, keepdims=True)
    return a / np.where(total > 0, total, 1.0)


def attention_weights_mx(q: mx.array, keys: mx.array, scale: float, mask: mx.array | None, softcap: float = 0.0
                         ) -> mx.array:
    """softmax(soft_cap(q·k · scale) + mask) in MLX: q (H, T, D), keys (Hkv, S, D), additive mask broadcastable
    to (H, T, S) -> (H, T, S)."""
    k = mx.repeat(keys, q.shape[0] // keys.shape[0], axis=0)
    logits = soft_cap(q @ k.transpose(0, 2, 1) * scale, softcap)
    return mx.softmax(logits if mask is None else logits + mask, axis=-1, precise=True)
