"""The live context: prefix reuse, and the KV budget kept by the eviction package on llama.cpp."""

from __future__ import annotations

from nexus_agent.memory import LiveContext, MemoryConfig
from nexus_agent.trace import Trace


def test_prefix_reuse_prefills_only_new_tokens(llamacpp_backend):
    tok = llamacpp_backend.tokenizer
    trace = Trace()
    live = LiveContext(llamacpp_backend, MemoryConfig(), 1024, trace)
    try:
        a = tok.encode("The quick brown fox jumps over the lazy dog.")
        b = a + tok.encode(" It was fast.")
        live.prefill(a)
        live.prefill(b)
        last = trace.of("memory")[-1]
        assert last["reused"] == len(a) and last["prefilled"] == len(b) - len(a)
        assert live.session.n_past == len(b)
    finally:
        live.close()


def test_budget_evicts_positionally_on_llamacpp(llamacpp_backend):
    tok = llamacpp_backend.tokenizer
    trace = Trace()
    live = LiveContext(llamacpp_backend, MemoryConfig(kv_budget=64, eviction="certified"), 1024, trace)
    try:
        ids = tok.encode(" ".join(f"word{i}" for i in range(60)))
        assert len(ids) > 64
        logits = live.prefill(ids)
        assert logits.shape == (tok.vocab_size,) or logits.shape[0] >= tok.vocab_size
        actions = [e["action"] for e in trace.of("memory")]
        assert "policy_fallback" in actions and "evict" in actions  # certified is MLX-only: streaming instead
        ev = next(e for e in trace.of("memory") if e["action"] == "evict")
        assert ev["cache_tokens"] <= 64
        live.session.decode(int(logits.argmax()))  # the session goes on at the next logical position
        assert live.session.n_past == len(ids) + 1
    finally:
        live.close()
