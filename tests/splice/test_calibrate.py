"""`splice.calibrate` on the real llama.cpp backend: what it measures and the curve it derives from that."""

import pytest

from splice.calibrate import CalibrationConfig, calibrate
from splice.profile import RepairPlan
from splice_fixtures import TOOL


def test_calibration_curve_follows_its_own_measurements(llamacpp_backend):
    config = CalibrationConfig(depths=(0, 64), heads=(0, 16, 64, 4096))
    profile = calibrate(llamacpp_backend, [TOOL], config, log=lambda *_: None)
    table = profile.measured
    # at the anchor the re-anchored block is the text prefill: the cheapest plan (no repair) must be chosen
    assert table["0"]["head0"]["kl"] < 1e-6 and profile.plan_for(0, 100) == RepairPlan("none", 0)
    for depth, head, *_ in profile.curve:
        row = table[str(depth)]
        chosen = row[f"head{head}"]
        bar = config.kl_margin * max(config.target_kl, 3 * row["text"]["kl"])
        top1_bar = row["text"]["top1_decisive"] - config.top1_slack
        assert chosen["kl"] <= bar and chosen["top1_decisive"] >= top1_bar
        assert chosen["ttft_ms"] < row["text"]["ttft_ms"]  # the timing gate
        cheaper = [f"head{h}" for h in config.heads if h < head]
        assert all(row[k]["kl"] > bar or row[k]["top1_decisive"] < top1_bar for k in cheaper)
    assert profile.max_depth == max(d for d, *_ in profile.curve)


def test_calibration_config_rejects_nonsense():
    with pytest.raises(ValueError, match="kl_margin"):
        CalibrationConfig(kl_margin=0)
    with pytest.raises(ValueError, match="decisive_margin"):
        CalibrationConfig(decisive_margin=-1)
    with pytest.raises(ValueError, match="heads"):
        CalibrationConfig(heads=(64, 16))
