"""The eviction certificate (DESIGN §7; papers/error-certificates-randomized-eviction.txt).

For one (layer, head, step) cell, from the retained set only: a_i = exp(q·k_i·s − max) (s the model's
attention scale, 1/√d by default; `native.models.attention`), N̂ = Σ a_i/π_i,
ŷ = Σ (a_i/π_i) v_i / N̂, x_u = Σ_{i∈u} a_i (v_i − ŷ)/N̂ summed over each sampling unit u (a sampled block;
with per-token sampling every token is its own unit), s_u = Σ_{i∈u} (a_i/π_i)/N̂ the unit's share of N̂ and
d_u = x_u / (π_u (1 − s_u)) = ŷ − ŷ₍₋ᵤ₎, the exact change of ŷ when unit u is deleted (the Hájek ratio's
delete-one jackknife; DESIGN's linearized x_u/π_u is its s_u → 0 limit and understates a unit that carries much
of N̂, which with 3 sampled blocks at a 12.5 % budget happens: s_u ≥ 0.30 in a tenth of the cells).
V̂ = Σ_u (1−π_u) ‖d_u‖², R̂ = max_u ‖d_u‖, L = log(2/δ), r = R̂L/3 + sqrt((R̂L/3)² + 2V̂L) (a Bernstein
radius), cert = r / (‖ŷ‖ + 1e-9): a (1−δ) bound on the relative error ‖ŷ − y‖/‖y‖ of the Hájek-corrected
attention output. Units with π = 1 (certainty layer, protected tokens) contribute nothing.
"""

from __future__ import annotations

import numpy as np

from native.models.attention import attention_logits


def certify_cell(q: np.ndarray, keys: np.ndarray, values: np.ndarray, pi: np.ndarray, unit: np.ndarray,
                 delta: float = 0.1, scale: float = 0.0, softcap: float = 0.0
                 ) -> tuple[float, np.ndarray, np.ndarray]:
    """q (D,), keys/values (N, D) retained and visible to q, pi (N,), unit (N,) sampling unit id (-1: π = 1),
    `scale` the attention scale (0: D ** -0.5), `softcap` its soft-cap (0: none). Returns (cert, ŷ (D,),
    per-token variance contribution (N,), the unit's term spread over its tokens)."""
    q, keys, values = (x.astype(np.float64) for x in (q, keys, values))
    logits = attention_logits(q[None, None], keys[None], scale, softcap)[0, 0]
    a = np.exp(logits - logits.max()) / pi
    n_hat = a.sum()
    y_hat = a @ values / n_hat
    x = (a * pi)[:, None] * (values - y_hat) / n_hat  # a_i (v_i − ŷ)/N̂, (N, D)
    contrib = np.zeros(len(pi))
    sampled = unit >= 0
    if not sampled.any():
        return 0.0, y_hat, contrib
    uid, inv = np.unique(unit[sampled], return_inverse=True)
    xu = np.zeros((len(uid), x.shape[1]))
    np.add.at(xu, inv, x[sampled])
    pu = np.zeros(len(uid))
    pu[inv] = pi[sampled]
    share = np.bincount(inv, weights=a[sampled]) / n_hat  # s_u < 1: protected sinks always carry mass
    norm = np.linalg.norm(xu, axis=1) / (pu * np.maximum(1.0 - share, 1e-12))  # ‖d_u‖
    var_u = (1.0 - pu) * norm**2
    v_hat, r_hat = var_u.sum(), norm.max()
    big_l = np.log(2.0 / delta)
    r = r_hat * big_l / 3.0 + np.sqrt((r_hat * big_l / 3.0) ** 2 + 2.0 * v_hat * big_l)
    counts = np.bincount(inv)
    contrib[np.nonzero(sampled)[0]] = var_u[inv] / counts[inv]
    return float(r / (np.linalg.norm(y_hat) + 1e-9)), y_hat, contrib


def aggregate(cells: dict[int, list[float]]) -> float:
    """Per step: mean over its (layer, head) cells; then max over steps (0.0 when nothing was certified)."""
    per_step = [float(np.mean(v)) for v in cells.values() if v]
    return max(per_step) if per_step else 0.0
