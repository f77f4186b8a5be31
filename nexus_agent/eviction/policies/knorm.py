"""`knorm`: keep keys with a low L2 norm (Devoto et al., 2024, "A simple and effective L2 norm-based
strategy for KV cache compression")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nexus_agent.eviction.policy import Observation, Policy


@dataclass
class KnormPolicy(Policy):
    """Score = max‖k‖ − ‖k_i‖ per KV head, (Hkv, N): low-norm keys tend to draw attention. Query-free."""

    name = "knorm"
    needs = frozenset({"keys"})

    def score(self, obs: Observation) -> np.ndarray:
        norms = np.linalg.norm(obs.keys, axis=-1).astype(np.float64)  # (Hkv, N)
        return norms.max(1, keepdims=True) - norms + 1e-6
