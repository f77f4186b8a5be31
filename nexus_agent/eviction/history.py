"""`AttentionHistory`: attention each cached key received from every query so far (H2O; Zhang et al., 2023).

Attached for policies whose `needs` holds "history". Per layer, (Hkv, S) float64: the softmax attention of each
query (causal mask and the current Hájek offsets included) summed over queries and averaged over the KV group's
query heads. Slots that arrive later start at zero.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from native.models.attention import attention_weights_mx
from nexus_agent.eviction.part import Part


class AttentionHistory(Part):
    def __init__(self, n_layers: int, n_kv_heads: int, scale: float, softcap: float = 0.0):
        self.scale, self.softcap = scale, softcap  # the model's attention scale and soft-cap
        self.h2o: list[np.ndarray] = [np.zeros((n_kv_heads, 0)) for _ in range(n_layers)]
        self.n = 0  # slots at the last `sync`: what each layer's row is padded to before a compaction

    def sync(self, n: int) -> None:
        self.n = n

    def on_query(self, layer: int, q: mx.array, qpos: np.ndarray) -> None:
        lk = self.session.cache.layers[layer]
        keys, _ = lk.view()
        att = attention_weights_mx(q[0], keys[0], self.scale, lk.mask(qpos)[0], self.softcap).sum(1)  # (H, S)
        g = q.shape[1] // keys.shape[1]
        acc = np.array(att.reshape(keys.shape[1], g, -1).mean(1))  # (Hkv, S)
        old = self.h2o[layer]
        self.h2o[layer] = np.concatenate([old, np.zeros((old.shape[0], acc.shape[1] - old.shape[1]))], 1) + acc

    def compact(self, slots: np.ndarray) -> None:
        self.h2o = [np.pad(h, ((0, 0), (0, self.n - h.shape[1])))[:, slots] for h in self.h2o]
        self.n = len(slots)
