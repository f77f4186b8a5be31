"""Offline NumPy fp32 replay of eviction on captured post-RoPE Q/K/V (DESIGN §8a).

`capture` runs the real MLX session once and records every layer's queries, keys and values. `replay` then
evicts the prompt part per (layer, KV head) with one policy at one budget, and measures for each answer query
(every layer and query head) the relative attention-output error ‖y_evicted − y_full‖/‖y_full‖, plus the
certificate of every 4th head. Shapes: L layers, H query heads, Hkv KV heads, N tokens, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from native.models.attention import attention_weights, visible
from nexus_agent.eviction.certificate import certify_cell
from nexus_agent.eviction.policy import Observation, Policy, block_ids, protected_mask


@dataclass
class Capture:
    q: np.ndarray  # (L, H, N, D) post-RoPE
    k: np.ndarray  # (L, Hkv, N, D) post-RoPE
    v: np.ndarray  # (L, Hkv, N, D)
    n_prompt: int  # tokens before the answer steps
    scale: float = 0.0  # the model's attention scale (0: D ** -0.5)
    windows: tuple[int, ...] = ()  # per layer sliding window (0 / (): global)
    softcap: float = 0.0  # the model's attention soft-cap (0: none)

    def layer(self, li: int) -> tuple[float, int]:
        """(scale, window) of layer li."""
        return self.scale, self.windows[li] if self.windows else 0


def capture(backend, ids: list[int], n_prompt: int) -> Capture:
    """Prefill `ids` on a fresh MLX session and record Q/K/V of every position (float32)."""
    import mlx.core as mx

    s = backend.new_session()
    qs: dict[int, list] = {}
    s.cache.query_hook = lambda layer, q, qpos: qs.setdefault(layer, []).append(np.array(q[0].astype(mx.float32)))
    s.prefill(ids)
    k, v = s.cache.export(np.arange(len(ids)))
    q = np.stack([np.concatenate(qs[i], axis=1) for i in range(len(qs))])
    s.close()
    return Capture(q, k, v, n_prompt, backend.info.scale, backend.info.windows, backend.info.attn_softcap)


def replay(cap: Capture, policy: Policy, budget: float, steps: int = 6, block: int = 32, sinks: int = 4,
           recent: int = 32, window: int = 16, seed: int = 0, delta: float = 0.1, h2o: bool = True):
    """Evict the first n_prompt keys to `budget` (fraction) per (layer, KV head) and answer `steps` queries.

    Returns rel_err (L, H, steps), cert (L, H//4+, steps) over heads 0, 4, 8, and the kept mask (L, Hkv, n).
    """
    rng = np.random.default_rng(seed)
    L, H, N, D = cap.q.shape
    hkv, n = cap.k.shape[1], cap.n_prompt
    g = H // hkv
    everyone = np.arange(N)
    pos = np.arange(n)
    prot = protected_mask(pos, n, sinks, recent)
    k_blocks = max(0, (int(round(budget * n)) - int(prot.sum())) // block)
    ids = block_ids(pos, prot, block, offset=sinks)
    cert_heads = list(range(0, H, 4))
    errs, certs, kept = np.zeros((L, H, steps)), np.zeros((L, len(cert_heads), steps)), np.zeros((L, hkv, n), bool)
    for li in range(L):
        k, v, q = cap.k[li], cap.v[li], cap.q[li]
        scale, win = cap.layer(li)
        sc = cap.softcap
        acc = None
        if "history" in policy.needs and h2o:
            acc = np.zeros((hkv, n))
            for c0 in range(0, n, 256):  # accumulated attention of every prompt query, in chunks
                qq = q[:, c0 : c0 + 256]
                a = attention_weights(qq, k[:, :n], scale, np.arange(c0, c0 + qq.shape[1]), pos, win, softcap=sc)
                acc += a.sum(1).reshape(hkv, g, n).mean(1)
        obs = Observation(k[:, :n], v[:, :n], pos, q[:, n - window : n], pos[n - window :], acc, scale, win, sc)
        scores = policy.score(obs)  # (Hkv, n)
        keep, pi = policy.select(scores, prot, k_blocks, ids, rng)
        kept[li] = keep
        bias = np.log(1.0 / pi) if policy.offset else np.zeros_like(pi)  # the Hájek offset
        for t in range(steps):
            qp = n + t
            vis = visible(np.array([qp]), everyone[: qp + 1], win)[0]
            for h in range(H):
                kh = h // g
                full = attention_weights(q[h : h + 1, qp : qp + 1], k[kh : kh + 1, : qp + 1], scale, np.array([qp]),
                                         everyone[: qp + 1], win, softcap=sc)[0, 0]
                y = full @ v[kh, : qp + 1]
                sel = np.concatenate([keep[kh], np.ones(t + 1, bool)]) & vis
                b = attention_weights(q[h : h + 1, qp : qp + 1], k[kh : kh + 1, : qp + 1][:, sel], scale,
                                      np.array([qp]), everyone[: qp + 1][sel], win,
                                      np.concatenate([bias[kh], np.zeros(t + 1)])[None, sel], sc)[0, 0]
                ye = b @ v[kh, : qp + 1][sel]
                errs[li, h, t] = np.linalg.norm(ye - y) / (np.linalg.norm(y) + 1e-12)
                if h in cert_heads and policy.offset:
                    p = np.concatenate([pi[kh], np.ones(t + 1)])[sel]
                    unit = np.concatenate([np.where(pi[kh] < 1, ids, -1), np.full(t + 1, -1)])[sel]
                    certs[li, cert_heads.index(h), t] = certify_cell(q[h, qp], k[kh, : qp + 1][sel],
                                                                     v[kh, : qp + 1][sel], p, unit, delta, scale,
                                                                     sc)[0]
    return errs, certs, kept


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two 1-D arrays (average ranks for ties are not needed here)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else float("nan")
