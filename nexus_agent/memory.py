"""The live KV context of an agent session: prefix reuse across prompts and a token budget.

`LiveContext.prefill(ids)` keeps the longest common prefix of what is cached and drops the rest, so a prompt
that extends the previous one costs only its new tokens. The budget (`kv_budget` tokens) is enforced before a
prefill: when an eviction manager is available (`nexus_agent.eviction`, see `attach_eviction`) it decides;
without a budget or without the package the fallback is a re-prefill from a shortened transcript (the
caller drops the oldest turns), which is always correct but costs a prefill. Every decision is reported to the
trace as a `memory` event.
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
        enforce_budget(self)
        if self.trace is not None:
            self.trace.emit("memory", action="prefill", reused=keep, prefilled=len(ids) - keep,
                            cache_tokens=len(self.ids), budget=self.budget)
        return logits

    def decoded(self, token: int) -> None:
        """Record a token the caller decoded on `self.session` directly."""
        self.ids.append(int(token))

    def begin_answer(self) -> None:
        """Mark the start of an answer at the next token fed (an evicting session certifies its first steps)."""
        self.session.begin_answer()

    def close(self) -> None:
        self.session.close()


def attach_eviction(live: LiveContext, config: MemoryConfig):
    """Keep `live` inside `config.kv_budget` with `nexus_agent.eviction` (None: no budget, or the package is
    absent, so the fallback re-prefill policy applies). MLX: the session is wrapped in an `EvictingSession`
    running the named policy with its disk tier (certified by default). llama.cpp: only positional policies can
    run; a score-based name falls back to `streaming`, and the trace says so."""
    if config.kv_budget is None:
        return None
    try:
        from nexus_agent.eviction import POSITIONAL_POLICIES, EvictingSession, EvictionConfig, make_policy
    except ImportError:
        return None
    ecfg = EvictionConfig(budget=int(config.kv_budget))
    if live.backend.capabilities.can_bias_keys:
        from registry.home import home_path

        spill = home_path("traces", f"spill-{id(live)}.kv")
        live.session = EvictingSession(live.session, make_policy(config.eviction), ecfg, spill)
        return {"kind": "scored", "policy": config.eviction, "config": ecfg}
    policy = config.eviction if config.eviction in POSITIONAL_POLICIES else "streaming"
    if live.trace is not None and policy != config.eviction:
        live.trace.emit("memory", action="policy_fallback", requested=config.eviction, policy=policy,
                        reason=f"{config.eviction} needs attention scores; llama.cpp runs only positional policies")
    return {"kind": "positional", "policy": policy, "config": ecfg}


def enforce_budget(live: LiveContext) -> None:
    """After a forward pass: positional eviction on llama.cpp (MLX's EvictingSession does it itself)."""
    m = live.manager
    if not m or m["kind"] != "positional" or live.session.n_past <= live.budget:
        return
    from nexus_agent.eviction import evict_positional

    cut = evict_positional(live.session, m["policy"], m["config"], live.budget)
    if cut:
        a, b = cut
        live.ids = live.ids[:a] + [-1] * (b - a) + live.ids[b:]  # evicted slots never match a new prompt
        if live.trace is not None:
            live.trace.emit("memory", action="evict", policy=m["policy"], removed=[a, b],
                            cache_tokens=len(live.ids) - (b - a), budget=live.budget)


def certify_answer(live: LiveContext) -> dict | None:
    """After an answer on an evicting MLX session: the certificate, and on a red flag a recall from the disk tier
    (the caller re-prefills from the transcript when nothing could be recalled). None when `attach_eviction`
    did not wrap the session (no budget, or a backend without per-key bias)."""
    if not live.manager or live.manager["kind"] != "scored":
        return None
    s = live.session
    out = {"certificate": float(s.certificate), "red_flag": bool(s.red_flag), "recalled": 0}
    if out["red_flag"]:
        out["recalled"] = int(len(s.recall(live.budget // 4)))
    if live.trace is not None:
        live.trace.emit("memory", action="certificate", **out)
    return out
