"""Learning from confirmed calls: a request that led to a validated, successful call of a tool (the server answered
ok and its result's first words report no failure: `nexus_agent.servers.Observation.confirmed`), or that a user
labelled with `nexus route --label TOOL`, becomes a learned example row of that tool.

Learned examples live in the registry store (registry.store.RegistryStore.add_examples, source "learned"):
one SQLite transaction per request (atomic: all of it or nothing), deduplicated by text, capped per tool
(oldest dropped first), deleted with the tool's schema. The buffer picks them up on the next incremental
`slb build`, which embeds only the new rows. Opt out with NEXUS_LEARN=0 (or LearnConfig(enabled=False)).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from registry.store import MAX_LEARNED


@dataclass
class LearnConfig:
    """enabled: record confirmed calls; cap: learned examples kept per tool."""

    enabled: bool = True
    cap: int = MAX_LEARNED

    def __post_init__(self) -> None:
        if not isinstance(self.cap, int) or self.cap < 1:
            raise ValueError(f"cap must be an integer >= 1, got {self.cap!r}")

    @classmethod
    def from_env(cls) -> "LearnConfig":
        """enabled unless NEXUS_LEARN is 0 / false / no / off."""
        return cls(enabled=os.environ.get("NEXUS_LEARN", "1").strip().lower() not in ("0", "false", "no", "off"))


class ExampleLearner:
    """Records confirmed (request, tool) pairs as learned examples in a registry store."""

    def __init__(self, store, config: LearnConfig | None = None):
        self.store, self.config = store, config or LearnConfig()
        self.learned = 0  # new examples recorded by this learner

    def confirm(self, request: str, tool: str, force: bool = False) -> bool:
        """Record `request` as a learned example of `tool` (skipped when learning is off, unless `force`, e.g. an
        explicit user label). True when a new example was stored (False: off, or the tool already has it).
        Raises KeyError for an unknown tool."""
        if not (self.config.enabled or force):
            return False
        new = self.store.add_examples(tool, [request], "learned", self.config.cap) > 0
        self.learned += new
        return new
