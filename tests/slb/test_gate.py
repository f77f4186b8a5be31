"""Margin-gate calibration: the chosen tau reaches the precision target on the data it was fitted on."""

from __future__ import annotations

import numpy as np
import pytest

from slb.gate import GateConfig, gate_stats, pick_floor, pick_tau


def test_pick_tau_reaches_target_and_maximizes_auto_rate():
    rng = np.random.default_rng(0)
    margins = rng.uniform(0, 0.3, 2000)
    correct = rng.uniform(size=2000) < 0.5 + 1.8 * margins  # larger margin -> more often right
    tau = pick_tau(margins, correct, 0.97)
    st = gate_stats(margins, correct, tau)
    assert st["auto_precision"] >= 0.97
    # one step lower (admitting the next query) must break the target, else tau was not the smallest
    below = np.sort(margins[margins <= tau])[-1]
    assert gate_stats(margins, correct, below - 1e-9)["auto_precision"] < 0.97 or below < 0


def test_pick_tau_never_auto_when_unreachable():
    assert pick_tau(np.linspace(0, 1, 50), np.zeros(50, bool), 0.9) == 2.0


def test_pick_floor_keeps_requested_recall():
    x = np.linspace(0.2, 0.8, 101)
    f = pick_floor(x, 0.95)
    assert np.mean(x >= f) >= 0.95 and np.mean(x >= f) < 0.97


def test_gate_config_validates():
    with pytest.raises(ValueError, match="floor"):
        GateConfig(floor=3)
    with pytest.raises(ValueError, match="k must"):
        GateConfig(k=0)


def test_abstention_fitted_with_leave_gold_out_negatives():
    from slb.gate import leave_gold_out, none_score, pick_abstention

    scores = np.array([[0.9, 0.5, 0.4], [0.6, 0.58, 0.3]], np.float32)
    ids = np.array([[3, 1, 2], [1, 3, 0]])
    top1, margin = leave_gold_out(scores, ids, np.array([3, 3]))
    np.testing.assert_allclose(top1, [0.5, 0.6])
    np.testing.assert_allclose(margin, [0.1, 0.3], atol=1e-6)
    rng = np.random.default_rng(0)
    # positives: high score or a clear margin; negatives: as high a score but no margin
    pos_t, pos_m = rng.uniform(0.4, 0.8, 400), rng.uniform(0.05, 0.3, 400)
    neg_t, neg_m = rng.uniform(0.35, 0.6, 400), rng.uniform(0.0, 0.03, 400)
    w, floor = pick_abstention(pos_t, pos_m, neg_t, neg_m, recall=0.98)
    plain = pick_abstention(pos_t, pos_m, neg_t, neg_m, recall=0.98, grid=(0.0,))
    assert w > 0 and plain[0] == 0.0  # the one grid value (exact by construction)
    assert np.mean(none_score(pos_t, pos_m, w) >= floor) >= 0.98  # the recall is kept
    rej_w = np.mean(none_score(neg_t, neg_m, w) < floor)
    assert rej_w > np.mean(neg_t < plain[1])  # and more no-tool queries go to none than with the plain floor
    with pytest.raises(ValueError, match="none_margin"):
        GateConfig(none_margin=-1.0)
