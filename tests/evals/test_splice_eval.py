"""`nexus eval splice` on one tool and two depths (MLX, uncalibrated default profile): the issue's JSON keys,
the `text` floor beside its bit-exact one-batch prefill, and the round-trip floor. The floor runs in 16-token
batches here (MLX's float32 path is batch-invariant, so it is as exact as one-token batches, which cost one
forward pass a token: 67 of the test's 97 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_eval_splice_writes_every_variant(tmp_path, routing_data):
    out = tmp_path / "splice.json"
    cmd = [sys.executable, "-m", "nexus_agent.cli", "eval", "splice", "--backend", "mlx", "--depths", "0,64",
           "--n-tools", "1", "--floor-batch", "16", "--tool-file", str(routing_data / "tools.jsonl"),
           "--json", str(out), "--plot", str(tmp_path / "splice.png")]
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "NEXUS_THREADS": "1"}, capture_output=True, text=True,
                       timeout=1200)  # a hang guard, not a speed bound: a busy CPU takes minutes
    assert p.returncode == 0, p.stderr[-3000:]
    depths = json.loads(out.read_text())["backends"]["mlx"]["depths"]
    assert set(depths) == {"0", "64"}
    for d, row in depths.items():
        for v in ("bare", "reanchored", "repaired", "text", "roundtrip"):
            assert {"kl", "top1", "ttft_ms", "redecode_frac"} <= set(row[v]), (d, v)
        assert row["text"]["kl"] < 1e-5 and row["text"]["top1"] == 1.0 and row["text"]["redecode_frac"] == 1.0
        assert row["text"]["batched_kl"] < 1e-8 and row["text"]["batched_top1"] == 1.0 and row["text"]["ttft_ms"] > 0
        assert row["roundtrip"]["ttft_ms"] is None and row["roundtrip"]["kl"] < 1e-8  # float32 keys: ~exact
        assert row["repaired"]["speedup"] > 0
    assert depths["0"]["reanchored"]["kl"] < 2e-3  # the block's own anchor
    assert depths["64"]["bare"]["kl"] > depths["64"]["reanchored"]["kl"]  # rotation buys fidelity at depth
    assert (tmp_path / "splice.png").read_bytes()[:4] == b"\x89PNG"  # fidelity, and TTFT beside it
    assert (tmp_path / "splice_ttft.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_eval_splice_on_gemma3(tmp_path, routing_data):
    """The packaged Gemma 3 on MLX: fidelity per depth, a block re-anchored beyond its 512-token window included."""
    out = tmp_path / "splice.json"
    cmd = [sys.executable, "-m", "nexus_agent.cli", "eval", "splice", "--backend", "mlx", "--model", "gemma3",
           "--depths", "600", "--n-tools", "1", "--floor-batch", "16", "--tool-file", str(routing_data / "tools.jsonl"),
           "--json", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "NEXUS_THREADS": "1"}, capture_output=True, text=True,
                       timeout=1200)  # a hang guard, not a speed bound
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())["backends"]["mlx"]
    assert r["architecture"] == "gemma3"
    row = r["depths"]["600"]  # one depth, past the 512-token window (depth 0 is covered on SmolLM2 above)
    assert row["text"]["kl"] < 1e-5 and row["text"]["top1"] == 1.0
    assert row["roundtrip"]["kl"] < 1e-8
    assert row["bare"]["kl"] > row["reanchored"]["kl"]
