"""`Certifier`: the eviction certificate of the live cache over the first answer steps (DESIGN §7).

After `begin_answer`, every query at positions first_step .. first_step + steps - 1 is certified on every
`head_stride`-th query head of every layer with `certificate.certify_cell`, from the retained keys, the
session's π (S,) and sampling units (S,). `certificate` aggregates the cells (mean per step, max over steps);
`var_contrib` (S,) accumulates each slot's share of the certificate variance V̂, which the disk tier's
neighbour ranking reads (papers/error-certificates-randomized-eviction.txt).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from threadpoolctl import threadpool_limits

from native.models.attention import visible
from nexus_agent.eviction.certificate import aggregate, certify_cell
from nexus_agent.eviction.part import Part


class Certifier(Part):
    def __init__(self, steps: int = 6, head_stride: int = 4, delta: float = 0.1):
        if steps < 1 or head_stride < 1 or not 0.0 < delta < 1.0:
            raise ValueError(f"need steps >= 1, head_stride >= 1 and 0 < delta < 1, got {steps}, {head_stride}, "
                             f"{delta}")
        self.steps, self.head_stride, self.delta = steps, head_stride, delta
        self.cells: dict[int, list[float]] | None = None  # query position -> cert of each (layer, head) cell
        self.first = 0  # position of the first answer step
        self.var_contrib = np.zeros(0)  # (S,) accumulated certificate variance contribution per slot
        self.answered = False  # an answer step was certified since the last begin_answer

    def begin(self, first_step: int, n_slots: int) -> None:
        """Certify the queries at first_step .. first_step + steps - 1; reset cells and per-slot variance."""
        self.cells = {}
        self.first = int(first_step)
        self.var_contrib = np.zeros(n_slots)
        self.answered = False

    @property
    def certificate(self) -> float:
        """Max over answer steps of the mean cert over (layer, every stride-th head) cells; 0.0 before any."""
        return aggregate(self.cells or {})

    def sync(self, n: int) -> None:
        self.var_contrib = np.concatenate([self.var_contrib, np.zeros(n - len(self.var_contrib))])

    def compact(self, slots: np.ndarray) -> None:
        self.var_contrib = self.var_contrib[slots]

    def on_query(self, layer: int, q: mx.array, qpos: np.ndarray) -> None:
        if self.cells is None:
            return
        steps = [t for t, p in enumerate(qpos) if 0 <= p - self.first < self.steps]
        if not steps:
            return
        with threadpool_limits(1, user_api="blas"):
            self._certify(layer, q, qpos, steps)

    def _certify(self, layer: int, q: mx.array, qpos: np.ndarray, steps: list[int]) -> None:
        s = self.session
        s.sync()
        lk = s.cache.layers[layer]
        k, v = lk.view()
        keys, values = np.array(k[0].astype(mx.float32)), np.array(v[0].astype(mx.float32))  # (Hkv, S, D)
        qs = np.array(q[0].astype(mx.float32))  # (H, T, D)
        g = qs.shape[0] // keys.shape[0]
        self.answered = True
        for t in steps:
            vis = visible(qpos[t : t + 1], lk.positions, lk.window)[0]
            for h in range(0, qs.shape[0], self.head_stride):
                cert, _, contrib = certify_cell(qs[h, t], keys[h // g, vis], values[h // g, vis], s.pi[vis],
                                                s.unit[vis], self.delta, s.info.scale, s.info.attn_softcap)
                self.cells.setdefault(int(qpos[t]), []).append(cert)
                self.var_contrib[np.nonzero(vis)[0]] += contrib
