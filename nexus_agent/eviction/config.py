"""Flat configuration of the KV cache manager (DESIGN §7)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EvictionConfig:
    """Budget and protected regions of an evicting cache.

    budget: tokens kept after an eviction; an int is absolute, a float in (0, 1] is a fraction of the
    prefill length (fixed at the end of the first prefill). block: eviction granularity in tokens (b=32).
    sinks: first tokens always kept. recent: last tokens always kept. window: queries per layer buffered
    for scoring (W). seed: RNG seed of the randomized policies.
    """

    budget: int | float = 0.25
    block: int = 32
    sinks: int = 4
    recent: int = 32
    window: int = 16
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.budget, bool) or not isinstance(self.budget, (int, float)):
            raise ValueError(f"budget must be an int (tokens) or a float fraction, got {self.budget!r}")
        if isinstance(self.budget, float) and not 0.0 < self.budget <= 1.0:
            raise ValueError(f"a fractional budget must be in (0, 1], got {self.budget}; pass an int for tokens")
        if isinstance(self.budget, int) and self.budget < self.sinks + self.recent:
            raise ValueError(f"budget={self.budget} tokens is below sinks+recent={self.sinks + self.recent}")
        for name in ("block", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sinks", "recent"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def tokens(self, prefill_len: int) -> int:
        """The budget in tokens for a sequence whose first prefill had `prefill_len` tokens."""
        if isinstance(self.budget, float):
            return max(self.sinks + self.recent, int(round(self.budget * prefill_len)))
        return self.budget
