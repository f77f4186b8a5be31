"""Disk tier (recall restores the exact K/V) and the llama.cpp positional path."""

from __future__ import annotations

import numpy as np
import pytest

from nexus_agent.eviction import EvictingSession, EvictionConfig, evict_positional, make_policy


def test_recall_restores_exact_kv(mlx_backend, tmp_path):
    ids = mlx_backend.tokenizer.encode("Thought: check the logs. Action: grep_logs(arg=1)\n" * 12)[:160]
    ref = mlx_backend.new_session()
    ref.prefill(ids)
    k_ref, v_ref = ref.cache.export(np.arange(len(ids)))
    s = EvictingSession(mlx_backend.new_session(), make_policy("certified"),
                        EvictionConfig(budget=64, block=16, recent=16), spill_path=tmp_path / "s.spill")
    s.prefill(ids)
    gone = sorted(set(range(len(ids))) - set(s.cache.positions.tolist()))
    rec_bytes = 2 * 30 * 3 * 64 * 4
    assert len(s.spill) == len(gone) and (tmp_path / "s.spill").stat().st_size == len(gone) * rec_bytes
    s.begin_answer()
    s.forward_logits(ids[:6])
    back = s.recall(budget_tokens=64, block=32)
    assert 0 < len(back) <= 64 and set(back.tolist()) <= set(gone)
    slots = np.array([np.nonzero(s.cache.positions == p)[0][0] for p in back])
    k, v = s.cache.export(slots)
    np.testing.assert_array_equal(k, k_ref[:, :, back])
    np.testing.assert_array_equal(v, v_ref[:, :, back])
    assert [s.tokens[i] for i in slots] == [ids[p] for p in back]
    assert all(layer.bias is None for layer in s.cache.layers)


def test_llamacpp_streaming_and_refusal(llamacpp_backend):
    from nexus_agent.eviction import POSITIONAL_POLICIES

    ids = llamacpp_backend.tokenizer.encode("Observation: the run finished with status ok.\n" * 12)[:160]
    s = llamacpp_backend.new_session(n_ctx=512)
    s.prefill(ids)
    cfg = EvictionConfig(budget=64, recent=32)
    assert evict_positional(s, "streaming", cfg, 64) == (4, len(ids) - 60)
    assert s.n_past == len(ids)
    logits = s.decode(ids[-1])
    assert np.isfinite(logits).all() and s.n_past == len(ids) + 1
    assert "streaming" in POSITIONAL_POLICIES
    with pytest.raises(ValueError, match="MLX"):
        evict_positional(s, "certified", cfg, 64)


def test_recalled_tokens_evicted_again_keep_one_record(mlx_backend, tmp_path):
    """Recall, then an eviction before `release`: the re-evicted tokens must not get a second spill record
    (a duplicate would later be recalled twice, putting one position in the cache two times)."""
    ids = mlx_backend.tokenizer.encode("Thought: check the logs. Action: grep_logs(arg=1)\n" * 20)[:240]
    s = EvictingSession(mlx_backend.new_session(), make_policy("streaming"),
                        EvictionConfig(budget=64, block=16, recent=16), spill_path=tmp_path / "s.spill")
    s.prefill(ids[:160])
    n_spilled = len(s.spill)
    s.begin_answer()
    s.forward_logits(ids[160:166])
    back = s.recall(budget_tokens=32, block=32)
    assert len(back) == 32
    s.forward_logits(ids[166:240])  # past budget + block: streaming evicts the old middle, recalled tokens too
    assert set(back.tolist()) - set(s.cache.positions.tolist())
    s.release()
    assert s.kept == s.cache.length  # what the next eviction counts from: only the tokens that really left
    on_disk = s.spill.positions
    assert len(np.unique(on_disk)) == len(on_disk) and n_spilled < len(on_disk)
    assert not set(s.spill.available().tolist()) & set(s.cache.positions.tolist())
    s.begin_answer()
    s.forward_logits(ids[:4])
    s.recall(budget_tokens=64, block=32)
    cached = s.cache.positions
    assert len(np.unique(cached)) == len(cached)
