"""`splice.calibrate` on the real llama.cpp backend: what it measures and the curve it derives from that."""

import pytest
from splice_fixtures import TOOL

from splice.calibrate import CalibrationConfig, calibrate, candidates
from splice.profile import RepairPlan, SpliceProfile, fit_length, plan_key


def test_calibration_curve_follows_its_own_measurements(llamacpp_backend):
    config = CalibrationConfig(depths=(0, 64), heads=(0, 16, 64, 4096), tails=(4,))
    profile = calibrate(llamacpp_backend, [TOOL], config, log=lambda *_: None)
    table = profile.measured
    # at the anchor the re-anchored block is the text prefill: the cheapest plan (no repair) must be chosen
    assert table["0"]["head0"]["kl"] < 1e-6 and profile.plan_for(0, 100) == RepairPlan("none", 0)
    order = [k for k, _, _ in candidates(config, 100, 30, can_blend=False)]
    curve_only = SpliceProfile(profile.backend, profile.fingerprint, curve=profile.curve, max_depth=profile.max_depth)
    for depth, *entry in profile.curve:
        row = table[str(depth)]
        text = row["text"]
        assert text["ttft_ms"] == min(text["ttft_ms_runs"]) and len(text["ttft_ms_runs"]) == 2  # timed before and after
        assert text["batched_kl"] < 1e-8 and 1e-5 < text["kl"] < 0.01  # timed in one batch, bars from one-token batches
        bar = config.kl_margin * max(config.target_kl, 3 * text["kl"])
        top1_bar = text["top1_decisive"] - config.top1_slack
        passing = [k for k in order if k in row and row[k]["kl"] <= bar and row[k]["top1_decisive"] >= top1_bar
                   and row[k]["ttft_ms"] < text["ttft_ms"]]  # the timing gate
        fast = [k for k in passing if text["ttft_ms"] / row[k]["ttft_ms"] >= config.floor_at(depth)]
        chosen = plan_key(*entry)
        assert chosen in passing
        # above the speed floor the cheapest plan as quiet as the text floor, else the lowest KL; below it the
        # cheapest plan that passes
        quiet = [k for k in fast if row[k]["kl"] <= text["kl"]]
        assert chosen == (quiet[0] if quiet else min(fast, key=lambda k: row[k]["kl"]) if fast else passing[0])
        # the options keep the passing plans measured, and at calibration's block length give the same pick
        opt = profile.options[str(depth)]
        assert [plan_key(*p[:3]) for p in opt["plans"]] == passing and opt["min_speedup"] == config.floor_at(depth)
        assert opt["text_kl"] == text["kl"]
        assert fit_length(opt, opt["n_tokens"]) == tuple((entry + [0, 0])[:3])
        assert profile.plan_for(depth, opt["n_tokens"]) == curve_only.plan_for(depth, opt["n_tokens"])
    assert profile.max_depth == max(d for d, *_ in profile.curve)


def test_calibration_config_rejects_nonsense():
    with pytest.raises(ValueError, match="kl_margin"):
        CalibrationConfig(kl_margin=0)
    with pytest.raises(ValueError, match="decisive_margin"):
        CalibrationConfig(decisive_margin=-1)
    with pytest.raises(ValueError, match="tails"):
        CalibrationConfig(tails=(0,))
    with pytest.raises(ValueError, match="min_speedup"):
        CalibrationConfig(min_speedup=-1)
    with pytest.raises(ValueError, match="min_speedup"):
        CalibrationConfig(min_speedup_deep=-1)
    floors = [CalibrationConfig().floor_at(d) for d in (0, 256, 257, 2048, 4096)]
    assert floors == pytest.approx([1.9, 1.9, 1.45, 1.45, 1.45]) and CalibrationConfig(min_speedup=0).floor_at(64) == 0
    with pytest.raises(ValueError, match="heads"):
        CalibrationConfig(heads=(64, 16))
