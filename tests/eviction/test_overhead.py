"""The overhead measurement on the real packaged model: three sessions from one prefill, events during decode."""

from __future__ import annotations

from evals.eviction_runtime import decode_overhead
from evals.eviction_traces import make_trace, needle_positions


def test_decode_overhead_times_decode_events_against_a_same_size_cache(mlx_backend):
    ids, _ = needle_positions(mlx_backend.tokenizer, make_trace(5, n_steps=10, n_facts=2))
    ids = ids[:300]
    out = decode_overhead(mlx_backend, ids, budget=100, rounds=1, steps=40)  # keeps 100: an event every 33 steps
    assert out["context_tokens"] == 300 and out["events"] >= 1  # a decode-time event, not only the prefill's
    assert out["evict_ms_per_event"] > 0 and out["evict_ms_prefill"] > 0 and out["tokens_per_event"] <= 40
    assert out["kv_bytes_evicting"] < out["kv_bytes_full"] / 2
    assert len(out["decode_overhead_frac_rounds"]) == 1
    assert all(out[k] > 0 for k in ("decode_ms_full_cache", "decode_ms_same_size_plain", "decode_ms_evicting"))
