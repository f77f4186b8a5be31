"""Positional eviction for backends without attention access (llama.cpp): sinks plus a recent window.

llama.cpp exposes `llama_memory_seq_rm` but neither queries nor per-key logit biases, and its K cache is not
readable per token without a state round-trip, so only the registered policies that read nothing from an
`Observation` (empty `needs`) can run there: `full` and `streaming`. `evict_positional` refuses the others
with a ValueError.
"""

from __future__ import annotations

import math

from nexus_agent.eviction.config import EvictionConfig
from nexus_agent.eviction.policies import POLICIES, make_policy

POSITIONAL_POLICIES = tuple(cls.name for cls in POLICIES if not cls.needs)


def evict_positional(session, policy_name: str, config: EvictionConfig, budget_tokens: int) -> tuple[int, int] | None:
    """Keep the first `config.sinks` positions and the most recent ones so that at most `budget_tokens` remain
    (all of them for a policy of unbounded `capacity`: `full`).

    `session` is any backend session with `remove(start, end)` and `n_past`; positions keep their absolute
    values (new tokens continue at n_past). Returns the removed [start, end) or None when nothing was removed.
    """
    if policy_name not in POSITIONAL_POLICIES:
        raise ValueError(f"policy {policy_name!r} needs attention scores or keys; on this backend only "
                         f"{', '.join(POSITIONAL_POLICIES)} can run (use the MLX backend for the others)")
    if math.isinf(make_policy(policy_name).capacity(budget_tokens)):
        return None  # it keeps every token
    recent = budget_tokens - config.sinks
    if recent < 1:
        raise ValueError(f"budget {budget_tokens} leaves no room after {config.sinks} sinks")
    start, end = config.sinks, session.n_past - recent
    if end <= start:
        return None
    session.remove(start, end)
    return start, end
