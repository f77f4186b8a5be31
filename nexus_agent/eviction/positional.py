"""Positional eviction for backends without attention access (llama.cpp): sinks plus a recent window.

llama.cpp exposes `llama_memory_seq_rm` but neither queries nor per-key logit biases, so only policies that
need no attention scores can run there: `streaming` (and `full`). Score-based policies (h2o, snapkv, tova,
capkv, reservoir, certified) and key-based ones (knorm, keydiff: the K cache is not readable per token without
a state round-trip) are MLX-only; `evict_positional` says so with a ValueError.
"""

from __future__ import annotations

from nexus_agent.eviction.config import EvictionConfig

POSITIONAL_POLICIES = ("full", "streaming")


def evict_positional(session, policy_name: str, config: EvictionConfig, budget_tokens: int) -> tuple[int, int] | None:
    """Keep the first `config.sinks` positions and the most recent ones so that at most `budget_tokens` remain.

    `session` is any backend session with `remove(start, end)` and `n_past`; positions keep their absolute
    values (new tokens continue at n_past). Returns the removed [start, end) or None when nothing was removed.
    """
    if policy_name not in POSITIONAL_POLICIES:
        raise ValueError(f"policy {policy_name!r} needs attention scores or keys; on this backend only "
                         f"{', '.join(POSITIONAL_POLICIES)} can run (use the MLX backend for the others)")
    if policy_name == "full":
        return None
    recent = budget_tokens - config.sinks
    if recent < 1:
        raise ValueError(f"budget {budget_tokens} leaves no room after {config.sinks} sinks")
    start, end = config.sinks, session.n_past - recent
    if end <= start:
        return None
    session.remove(start, end)
    return start, end
