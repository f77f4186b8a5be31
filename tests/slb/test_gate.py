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
