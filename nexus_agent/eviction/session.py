"""`EvictingSession`: an MLX session kept inside a KV budget by one policy (DESIGN §7).

Wraps `native.mlx_backend.MLXSession` (compose, do not subclass): prefill/decode/forward_logits pass through.
The base owns the hooking and the compaction: the cache's query hook buffers the last W queries per layer;
eviction runs at the end of the first prefill and whenever the cache passes the budget by a block; it builds
one `Observation` per layer, asks the policy for scores and one slot set for all layers, and compacts the
cache (`KVCache.keep`). Blocks are cut by absolute position, so a kept block stays one block across events.
Per slot it keeps π (S,), the cumulative inclusion probability (multiplied across evictions), the last
sampling unit (S,) (-1: π = 1) and a persistent reservoir's uniforms `draws` (S, n), drawn when the slot enters.
The rest are parts (`part.Part`): `AttentionHistory` (H2O), `Certifier`, `DiskTier`; the Hájek offset
(`hajek.py`) is applied after each eviction for a policy whose `offset` is set.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import native  # noqa: F401  (first: MLX must bind its BLAS symbols to OpenBLAS, see native.blas)

# isort: split
import mlx.core as mx
from threadpoolctl import threadpool_limits

from nexus_agent.eviction.certifier import Certifier
from nexus_agent.eviction.config import EvictionConfig
from nexus_agent.eviction.disk_tier import RANKS, DiskTier
from nexus_agent.eviction.hajek import apply_offsets
from nexus_agent.eviction.history import AttentionHistory
from nexus_agent.eviction.policy import Observation, Policy, block_ids, protected_mask
from nexus_agent.eviction.spill import SpillFile


class EvictingSession:
    """session: an MLX session (per-key bias); policy: any registered `Policy`; spill_path: the disk tier's file
    (None: evicted tokens vanish); cert_steps, cert_head_stride, delta: the `Certifier`; spill_flag_at: the
    disk tier's `evicted_attention` threshold of `spill_flag`."""

    def __init__(self, session, policy: Policy, config: EvictionConfig | None = None,
                 spill_path: str | Path | None = None, cert_steps: int = 6, cert_head_stride: int = 4,
                 delta: float = 0.1, spill_flag_at: float = 0.9):
        if not session.backend.capabilities.can_bias_keys:
            raise ValueError("EvictingSession needs a backend with per-key bias (MLX); "
                             "use eviction.positional for llama.cpp")
        self.inner, self.policy, self.config = session, policy, config or EvictionConfig()
        self.cache, self.info = session.cache, session.info
        self.rng = np.random.default_rng(self.config.seed)
        self.budget: int | None = None if isinstance(self.config.budget, float) else self.config.budget
        self.kept = 0  # cache length right after the last eviction (plus recalled tokens)
        self.pi = np.ones(0)  # (S,)
        self.unit = np.zeros(0, dtype=np.int64)  # (S,)
        self.draws = np.zeros((0, policy.slot_draws))  # (S, n)
        self._next_unit = 0
        self.queries: list[list] = [[] for _ in range(self.info.n_layers)]  # per layer: [(q mx (H,T,D), qpos)]
        self._buffered = [0] * self.info.n_layers  # query tokens in each layer's buffer
        self.evict_ms: list[float] = []
        info = self.info
        self.history = AttentionHistory(info.n_layers, info.n_kv_heads, info.scale, info.attn_softcap) \
            if "history" in policy.needs else None
        self.certifier = Certifier(cert_steps, cert_head_stride, delta)
        self.disk = DiskTier(SpillFile(spill_path, info.n_layers, info.n_kv_heads, info.head_dim), self.certifier,
                             spill_flag_at) if spill_path else None
        self.parts = [p for p in (self.history, self.certifier, self.disk) if p is not None]
        for part in self.parts:
            part.session = self
        self.cache.query_hook = self._hook

    # -- pass-through ------------------------------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return self.inner.n_past

    @property
    def tokens(self) -> list[int]:
        return self.inner.tokens

    def prefill(self, tokens) -> np.ndarray:
        out = self.inner.prefill(tokens)
        self._after_forward(first=self.budget is None)
        return out

    def decode(self, token: int) -> np.ndarray:
        out = self.inner.decode(token)
        self._after_forward()
        return out

    def forward_logits(self, tokens) -> np.ndarray:
        out = self.inner.forward_logits(tokens)
        self._after_forward(first=self.budget is None)
        return out

    def export_kv(self, start: int, end: int):
        return self.inner.export_kv(start, end)

    def import_kv(self, kv, span: tuple[int, int] | None = None, rotate: bool = True) -> None:
        """Splice `kv` in (see `native.base.KVSession`); its slots enter with π = 1. No eviction here: a splice
        is several steps (insert, repair), so the budget is checked at the next forward pass."""
        self.inner.import_kv(kv, span, rotate)
        self.sync()

    def recompute_kv(self, start: int, end: int, frac: float) -> np.ndarray:
        return self.inner.recompute_kv(start, end, frac)

    def remove(self, start: int, end: int) -> None:
        """Drop positions [start, end) without spilling them (rewinding a probe), keeping per-slot state aligned."""
        pos = self.cache.positions
        keep = np.nonzero((pos < start) | (pos >= end))[0]
        self.sync()
        self.inner.remove(start, end)
        self._compact(keep)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.query_hook = None
        self.inner.close()

    # -- hook and per-slot state --------------------------------------------------------------------------------
    def _hook(self, layer: int, q: mx.array, qpos: np.ndarray) -> None:
        w = self.config.window
        buf = self.queries[layer]
        buf.append((q[0, :, -w:, :], qpos[-w:]))
        self._buffered[layer] += len(buf[-1][1])
        if self._buffered[layer] > 2 * w:  # a running count: no sum over the buffer per decode step
            self.queries[layer] = buf = buf[-w:]
            self._buffered[layer] = sum(len(p) for _, p in buf)
        for part in self.parts:
            part.on_query(layer, q, qpos)

    def window(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The last W buffered queries of one layer, (H, W, D) float32, and their positions (W,)."""
        buf, w = self.queries[layer], self.config.window
        q = buf[0][0] if len(buf) == 1 else mx.concatenate([x for x, _ in buf], axis=1)
        return np.array(q[:, -w:].astype(mx.float32)), np.concatenate([p for _, p in buf])[-w:]  # one copy

    def sync(self) -> None:
        """Extend the per-slot state to the cache's slots (new slots: π = 1, no unit, fresh uniforms)."""
        n = self.cache.length
        self.pi = np.concatenate([self.pi, np.ones(n - len(self.pi))])
        self.unit = np.concatenate([self.unit, np.full(n - len(self.unit), -1, dtype=np.int64)])
        for part in self.parts:
            part.sync(n)
        if n > len(self.draws):  # uniforms are drawn once, when a token enters the cache (none: no RNG use)
            new = (n - len(self.draws), self.draws.shape[1])
            self.draws = np.concatenate([self.draws, self.rng.random(new) if new[1] else np.zeros(new)])

    def _compact(self, slots: np.ndarray) -> None:
        self.pi, self.unit, self.draws = self.pi[slots], self.unit[slots], self.draws[slots]
        for part in self.parts:
            part.compact(slots)

    def keep(self, slots: np.ndarray) -> None:
        """Compact the cache, its tokens and every per-slot state to `slots` (in order)."""
        self.cache.keep(slots)
        self.inner.tokens = [self.inner.tokens[s] for s in slots]
        self._compact(slots)

    def reweight(self) -> None:
        """The Hájek offset log(1/π) on every layer, for a policy whose `offset` is set."""
        if self.policy.offset:
            apply_offsets(self.cache, self.pi)

    # -- eviction ------------------------------------------------------------------------------------------------
    def _after_forward(self, first: bool = False) -> None:
        self.sync()
        if first:
            self.budget = self.config.tokens(self.cache.length)
        # A Poisson keep can land above the budget: the next event waits for a block of new tokens on top of
        # what was kept, so it does not fire in the middle of an answer.
        limit = max(self.policy.capacity(self.budget), self.kept) + (0 if first else self.config.block)
        if self.cache.length > limit:
            self.evict()

    def evict(self) -> None:
        """Score every layer, select one slot set for all layers down to the budget, spill and compact."""
        with threadpool_limits(1, user_api="blas"):  # small NumPy products: BLAS threads only contend with MLX
            self._evict()

    def _evict(self) -> None:
        t0 = time.perf_counter()
        self.sync()
        c, cache, policy = self.config, self.cache, self.policy
        pos, n = cache.positions.copy(), cache.length
        sinks = policy.sinks(c.sinks, c.block)
        protected = protected_mask(pos, self.n_past, sinks, c.recent)
        k_blocks = max(0, (self.budget - int(protected.sum())) // c.block)
        ids = block_ids(pos, protected, c.block, offset=sinks)
        agg = np.zeros(n)
        for li, layer in enumerate(cache.layers):  # one layer at a time: float32 copies of one layer's cache only
            k, v = layer.view()
            q, qp = self.window(li)
            obs = Observation(np.array(k[0].astype(mx.float32)),
                              np.array(v[0].astype(mx.float32)) if "values" in policy.needs else None, pos, q, qp,
                              self.history.h2o[li] if self.history else None, self.info.scale, self.info.window(li),
                              self.info.attn_softcap)
            s = policy.score(obs)  # (Hkv, N)
            s = s - s.min(1, keepdims=True)
            agg += (s / (s.sum(1, keepdims=True) + 1e-30)).mean(0)
        kw = {}
        if self.draws.shape[1]:  # a block's uniforms are those of its first slot: (n, 1, nb)
            blocks, first = np.unique(ids, return_index=True)
            kw["u"] = self.draws[first[blocks >= 0]].T[:, None]
        keep, pi = policy.select(agg[None] / len(cache.layers), protected, k_blocks, ids, self.rng, **kw)
        keep, pi = keep[0], pi[0]
        gone = np.nonzero(~keep)[0]
        if len(gone):
            for part in self.parts:
                part.on_evict(gone)
        sampled = keep & (pi < 1.0)
        if sampled.any():
            _, inv = np.unique(ids[sampled], return_inverse=True)
            self.unit[sampled] = self._next_unit + inv
            self._next_unit += int(inv.max()) + 1
        self.pi = self.pi * pi
        self.keep(np.nonzero(keep)[0])
        self.reweight()
        self.kept = cache.length
        self.evict_ms.append(1e3 * (time.perf_counter() - t0))

    # -- the answer path: certificate and disk tier ----------------------------------------------------------------
    def begin_answer(self, first_step: int | None = None) -> None:
        """Start certifying the answer steps: query positions first_step .. first_step + cert_steps - 1.

        An answer step is a query that predicts an answer token, so the first one is the last prompt token's;
        pass its position when the prompt and the answer go through one forward (`first_step` defaults to
        `n_past`: the next token fed is the first answer step). Resets the cells, the per-slot variance
        contributions and whether an answer step was seen (what `recall` and `evicted_attention` need)."""
        self.certifier.begin(self.n_past if first_step is None else first_step, self.cache.length)

    @property
    def certificate(self) -> float:
        """Max over answer steps of the mean cert over (layer, every 4th head) cells; 0.0 before any answer."""
        return self.certifier.certificate

    @property
    def red_flag(self) -> bool:
        """The certificate flags the answer: cert >= 1 (DESIGN §7)."""
        return self.certificate >= 1.0

    @property
    def var_contrib(self) -> np.ndarray:
        """(S,) each slot's accumulated certificate variance contribution over the answer steps."""
        return self.certifier.var_contrib

    @property
    def spill(self) -> SpillFile | None:
        return self.disk.spill if self.disk else None

    @property
    def spill_flag_at(self) -> float | None:
        return self.disk.flag_at if self.disk else None

    @property
    def spill_flag(self) -> bool:
        """The disk tier's flag: some head of the last question/answer would attend to an evicted key with weight
        >= `spill_flag_at` (False without a disk tier)."""
        return self.disk.flag if self.disk else False

    def evicted_attention(self) -> float:
        """`DiskTier.evicted_attention`: near 0 when the answer would not look at anything evicted (0.0 without a
        disk tier)."""
        return self.disk.evicted_attention() if self.disk else 0.0

    def recall(self, budget_tokens: int, block: int | None = None, rank: str = "attention") -> np.ndarray:
        """`DiskTier.recall`: up to `budget_tokens` evicted tokens back, best first; their positions (T,)."""
        if self.disk is None:
            if rank not in RANKS:
                raise ValueError(f"rank must be 'neighbours' or 'attention', got {rank!r}")
            return np.zeros(0, dtype=np.int64)
        return self.disk.recall(budget_tokens, block, rank)

    def release(self) -> None:
        """`DiskTier.release`: undo the last `recall`."""
        if self.disk is not None:
            self.disk.release()
