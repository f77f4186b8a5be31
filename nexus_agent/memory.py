"""The live KV context of an agent session: prefix reuse across prompts and a token budget.

`LiveContext.prefill(ids)` keeps the longest common prefix of what is cached and drops the rest, so a prompt
that extends the previous one costs only its new tokens. The budget (`kv_budget` tokens) is enforced before a
prefill: when an eviction manager is available (`nexus_agent.eviction`, see `attach_eviction`) it decides;
without one the fallback is a re-prefill from a shortened transcript (the caller drops the oldest turns),
which is always correct but costs a prefill. Every decision is reported to the trace as a `memory` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class MemoryConfig:
    """kv_budget: most tokens the live cache may hold (None: the context size); eviction: policy name."""

    kv_budget: int | None = None
    eviction: str = "certified"

    def __post_init__(self):
        if self.kv_budget is not None and self.kv_budget < 64:
            raise ValueError(f"--kv-budget must be at least 64 tokens, got {self.kv_budget}")


class LiveContext:
    """One backend session plus the token ids it holds, in position order."""

    def __init__(self, backend, config: MemoryConfig | None = None, n_ctx: int = 8192, trace=None):
        self.backend, self.config, self.trace = backend, config or MemoryConfig(), trace
        self.n_ctx = n_ctx
        self.session = backend.new_session(n_ctx)
        self.ids: list[int] = []
        self.manager = attach_eviction(self, self.config)

    @property
    def budget(self) -> int:
        return min(self.config.kv_budget or self.n_ctx, self.n_ctx)

    def fits(self, n_tokens: int, reserve: int = 0) -> bool:
        return n_tokens + reserve <= self.budget

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold exactly `ids` (reusing the common prefix) and return the next-token logits."""
        ids = [int(t) for t in ids]
        keep = 0
        for a, b in zip(self.ids, ids):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)  # always prefill at least one token to get fresh logits
        if keep < self.session.n_past:
            self.session.remove(keep, self.session.n_past)
        self.ids = self.ids[:keep]
        logits = self.session.prefill(ids[keep:])
        self.ids = list(ids)
        if self.trace is not None:
            self.trace.emit("memory", action="prefill", reused=keep, prefilled=len(ids) - keep,
                            cache_tokens=len(self.ids), budget=self.budget)
        return logits

    def decoded(self, token: int) -> None:
        """Record a token the caller decoded on `self.session` directly."""
        self.ids.append(int(token))

    def close(self) -> None:
        self.session.close()


def attach_eviction(live: LiveContext, config: MemoryConfig):
    """The eviction manager for `live` when `nexus_agent.eviction` provides one; None otherwise (the budget is
    then kept by re-prefilling a shortened transcript)."""
    try:
        from nexus_agent import eviction  # noqa: F401
    except ImportError:
        return None
    make = getattr(eviction, "make_manager", None)
    if make is None:
        return None
    try:
        return make(live.session, budget=live.budget, policy=config.eviction)
    except Exception as e:  # a policy the backend cannot run (e.g. certified on llama.cpp): say so, fall back
        if live.trace is not None:
            live.trace.emit("memory", action="eviction_unavailable", reason=str(e))
        return None
