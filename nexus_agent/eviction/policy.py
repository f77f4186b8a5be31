"""The shared base of all eviction policies: observation, block pooling, top-k and protection.

A policy sees one layer at a time through an `Observation` and returns scores (rows, N) with `score()`;
the base turns scores into a keep mask at block granularity with deterministic top-k. Randomized policies
(reservoir, certified) override `select()` and also return the inclusion probabilities π of what they kept.
A policy states what it reads instead of how the session should behave: `needs` (Observation fields),
`sinks()` (leading tokens it forces), `capacity()` (tokens it holds at a budget), `slot_draws` (uniforms per
slot), `offset` (its π are Hájek weights, see `hajek.py`). Rows are KV heads (offline replay, per-head sets)
or a single aggregated row (the runtime cache, one slot set shared by all layers and heads).
Shapes: H query heads, Hkv KV heads, N cached keys, W buffered queries, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from native.models.attention import attention_weights


@dataclass
class Observation:
    """One layer's cache as float32 NumPy: keys/values (Hkv, N, D) post-RoPE, positions (N,), queries (H, W, D)
    post-RoPE at qpos (W,), h2o (Hkv, N) accumulated attention or None; the layer's attention `scale` (0:
    D ** -0.5) and sliding `window` (0: global). The runtime cache passes values=None and h2o=None to a policy
    whose `needs` lacks "values" / "history"."""

    keys: np.ndarray
    values: np.ndarray | None
    positions: np.ndarray
    queries: np.ndarray
    qpos: np.ndarray
    h2o: np.ndarray | None = None
    scale: float = 0.0
    window: int = 0
    softcap: float = 0.0  # the model's attention soft-cap (0: none)

    @property
    def group(self) -> int:
        return self.queries.shape[0] // self.keys.shape[0]

    def attention(self) -> np.ndarray:
        """The model's softmax attention of the buffered queries, (H, W, N), rows sum to 1."""
        return attention_weights(self.queries, self.keys, self.scale, self.qpos, self.positions, self.window,
                                 softcap=self.softcap)

    def head_mean(self, per_query_head: np.ndarray) -> np.ndarray:
        """Average (H, ...) over the query heads of each KV group -> (Hkv, ...)."""
        h = per_query_head.shape[0]
        return per_query_head.reshape(h // self.group, self.group, *per_query_head.shape[1:]).mean(1)


def block_ids(positions: np.ndarray, protected: np.ndarray, block: int, offset: int = 0) -> np.ndarray:
    """Block index of each slot (-1 for protected slots): the free slots with the same (position - offset) //
    block form one block, numbered 0.. in position order. Cut by absolute position, so over repeated evictions
    a kept block stays one block (a kept partial block is completed by its later tokens instead of shifting
    every later cut); on one contiguous prefill with offset = the sink count, free slots are cut in slot order."""
    ids = np.full(len(positions), -1, dtype=np.int64)
    free = np.nonzero(~protected)[0]
    if len(free):
        ids[free] = np.unique((positions[free] - offset) // block, return_inverse=True)[1].ravel()
    return ids


def pool(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Sum token scores (R, N) into block scores (R, nb) with the ids from `block_ids`."""
    nb = int(ids.max()) + 1 if (ids >= 0).any() else 0
    out = np.zeros((scores.shape[0], nb), dtype=np.float64)
    m = ids >= 0
    for r in range(scores.shape[0]):
        out[r] = np.bincount(ids[m], weights=scores[r, m], minlength=nb)
    return out


def expand(block_values: np.ndarray, ids: np.ndarray, protected_value) -> np.ndarray:
    """Map block values (R, nb) back to slots (R, N); protected slots get `protected_value`."""
    out = np.full((block_values.shape[0], len(ids)), protected_value, dtype=block_values.dtype)
    m = ids >= 0
    out[:, m] = block_values[:, ids[m]]
    return out


OBSERVABLE = frozenset({"keys", "queries", "values", "history"})  # what a policy can read from an Observation


@dataclass
class Policy:
    """Base of all policies. `name` is the registry key; subclasses implement `score` or `select`.

    needs: the Observation fields `score` reads beyond positions and shapes (a subset of `OBSERVABLE`). The MLX
    session always passes keys and queries, converts values only for "values" and accumulates attention of every
    query for "history" (H2O); a policy that needs nothing runs on llama.cpp too (`positional.py`).
    offset: the kept keys' π are Hájek weights, so the session adds log(1/π) to their logits (`hajek.py`).
    slot_draws: uniforms per slot drawn when the slot enters the cache and passed to `select(u=)` (n, R, nb)."""

    name = "base"
    needs = frozenset({"keys", "queries"})
    offset = False
    slot_draws = 0

    def sinks(self, sinks: int, block: int) -> int:
        """Leading cached tokens this policy always keeps, given the configured `sinks` and `block` size."""
        return sinks

    def capacity(self, budget: int) -> float:
        """Most tokens the cache holds under this policy at `budget` tokens (inf: it never evicts)."""
        return budget

    def score(self, obs: Observation) -> np.ndarray:
        """Keep-worthiness of each key, (Hkv, N), higher = keep."""
        raise NotImplementedError(f"{type(self).__name__} must implement score() or select()")

    def select(self, scores: np.ndarray, protected: np.ndarray, k_blocks: int, ids: np.ndarray,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Deterministic top-k blocks. scores (R, N); returns keep (R, N) bool and π (R, N) = 1."""
        bs = pool(scores, ids)  # (R, nb)
        keep_b = np.zeros(bs.shape, dtype=bool)
        k = min(k_blocks, bs.shape[1])
        if k > 0:
            top = np.argpartition(-bs, k - 1, axis=1)[:, :k]
            np.put_along_axis(keep_b, top, True, axis=1)
        keep = expand(keep_b, ids, True)
        return keep, np.ones(keep.shape, dtype=np.float64)


def protected_mask(positions: np.ndarray, n_past: int, sinks: int, recent: int) -> np.ndarray:
    """(N,) True for the first `sinks` cached positions and positions within `recent` of n_past."""
    order = np.argsort(positions, kind="stable")
    prot = positions >= n_past - recent
    prot[order[:sinks]] = True
    return prot
