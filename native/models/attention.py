"""The attention formula, once: the runtime call (MLX) and the weights other parts of Nexus read (NumPy).

Every architecture projects its own queries, keys and values, rotates them with its layer's `Rope`, then calls
`attend`: the layer's cache stores the keys at their absolute positions, shows the queries to the query hook
(eviction scoring) and builds the mask (position order, sliding window, additive per-key bias). Eviction scores,
the Hájek certificate, the disk tier and the replay eval compute the same softmax(q·k · scale + mask) through
`attention_weights` with the layer's `scale` and `window` (`native.base.ModelInfo`).
Shapes: H query heads, Hkv key/value heads (H = g·Hkv), T/W queries, S/N keys, D head dim.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def attend(q: mx.array, k: mx.array, v: mx.array, layer_cache, offset, scale: float) -> mx.array:
    """Store k, v (B, Hkv, T, D) in `layer_cache` at positions offset.. (or the cache's own slots) and attend
    from q (B, H, T, D) over every cached key: (B, H, T, D)."""
    keys, values, mask = layer_cache.update_and_fetch(k, v, q, offset)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)


def visible(qpos: np.ndarray, kpos: np.ndarray, window: int = 0) -> np.ndarray:
    """(T, S) bool: a query at position p sees keys at positions <= p, and with a sliding window only those
    with p - position < window (llama.cpp's and Hugging Face's rule)."""
    ok = kpos[None, :] <= qpos[:, None]
    if window:
        ok &= qpos[:, None] - kpos[None, :] < window
    return ok


def attention_logits(q: np.ndarray, k: np.ndarray, scale: float = 0.0) -> np.ndarray:
    """Scaled scores (H, W, N) of queries q (H, W, D) against keys k (Hkv, N, D); query head h reads KV head
    h // g; `scale` 0 means D ** -0.5. Per-head 2-D products: a batched matmul contends with MLX for BLAS threads."""
    g = q.shape[0] // k.shape[0]
    return np.stack([q[h] @ k[h // g].T for h in range(q.shape[0])]) * (scale or q.shape[-1] ** -0.5)


def attention_weights(q: np.ndarray, k: np.ndarray, scale: float, qpos: np.ndarray, kpos: np.ndarray,
                      window: int = 0, bias: np.ndarray | None = None) -> np.ndarray:
    """softmax over keys of q·k · scale + bias (Hkv, N) with the causal / sliding-window mask: (H, W, N), rows
    sum to 1 (a row that sees no key is all zero)."""
    logits = attention_logits(q, k, scale)
    if bias is not None:
        logits = logits + np.repeat(bias, q.shape[0] // k.shape[0], axis=0)[:, None, :]
    logits = np.where(visible(qpos, kpos, window)[None], logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    a = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
    total = a.sum(-1, keepdims=True)
    return a / np.where(total > 0, total, 1.0)


def attention_weights_mx(q: mx.array, keys: mx.array, scale: float, mask: mx.array | None) -> mx.array:
    """softmax(q·k · scale + mask) in MLX: q (H, T, D), keys (Hkv, S, D), additive mask broadcastable to
    (H, T, S) -> (H, T, S)."""
    k = mx.repeat(keys, q.shape[0] // keys.shape[0], axis=0)
    logits = q @ k.transpose(0, 2, 1) * scale
    return mx.softmax(logits if mask is None else logits + mask, axis=-1)
