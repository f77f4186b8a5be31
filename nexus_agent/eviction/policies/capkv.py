"""`capkv`: information capacity of values under query-aligned weights (papers/capkv-information-capacity-
eviction.txt; DESIGN §7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy


@dataclass
class CapKVPolicy(Policy):
    """Per KV head: μ_q = mean buffered query of the group; w_i = exp(τ cos(k_i, μ_q) − max);
    A = I + Σ w_i v_i v_iᵀ; s_i = w_i v_iᵀ A⁻¹ v_i (leverage of v_i). Returns (Hkv, N). O(N D² + D³)."""

    name = "capkv"
    needs = frozenset({"keys", "queries", "values"})
    tau: float = 5.0

    def __post_init__(self):
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")

    def score(self, obs: Observation) -> np.ndarray:
        hkv, n, d = obs.keys.shape
        q = obs.queries.astype(np.float64).reshape(hkv, obs.group * obs.queries.shape[1], d).mean(1)  # (Hkv, D)
        out = np.empty((hkv, n))
        for h in range(hkv):
            k, v = obs.keys[h].astype(np.float64), obs.values[h].astype(np.float64)
            cos = k @ q[h] / (np.linalg.norm(k, axis=1) * np.linalg.norm(q[h]) + 1e-9)
            w = np.exp(self.tau * (cos - cos.max()))
            a = np.eye(d) + (v * w[:, None]).T @ v
            out[h] = w * np.einsum("nd,nd->n", v, np.linalg.solve(a, v.T).T)
        return out
