"""The Hájek offset: log(1/π) added to the logits of kept keys, for any cache with per-key biases.

With keys kept with inclusion probability π_i, softmax attention over the kept keys with logits
q·k_i/√d + log(1/π_i) is the Hájek ratio estimator Σ (a_i/π_i) v_i / Σ a_i/π_i of the full attention output
(papers/error-certificates-randomized-eviction.txt; DESIGN §7). The offset is per slot and shared by every
layer and KV head: bias (Hkv, S) float32 on each `LayerKV` of a `native.mlx_cache.KVCache`.
"""

from __future__ import annotations

import numpy as np


def apply_offsets(cache, pi: np.ndarray) -> None:
    """Set every layer's bias to log(1/π) for π (S,) in (0, 1]; with no π < 1 the biases are left as they are
    (a compacted bias of zeros attends like none)."""
    if (pi >= 1.0).all():
        return
    bias = np.broadcast_to(np.log(1.0 / pi).astype(np.float32), (cache.layers[0].n_kv_heads, len(pi)))
    for layer in cache.layers:
        layer.bias = bias.copy()


def clear_offsets(cache) -> None:
    """Remove every layer's bias: the cache is attended plainly (π = 1)."""
    for layer in cache.layers:
        layer.bias = None
