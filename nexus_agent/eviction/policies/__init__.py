"""Every eviction policy, one per file, registered in one list (drives the test matrix and the eval)."""

from __future__ import annotations

from nexus_agent.eviction.policies.capkv import CapKVPolicy
from nexus_agent.eviction.policies.certified import CertifiedPolicy
from nexus_agent.eviction.policies.full import FullPolicy
from nexus_agent.eviction.policies.h2o import H2OPolicy
from nexus_agent.eviction.policies.keydiff import KeyDiffPolicy
from nexus_agent.eviction.policies.knorm import KnormPolicy
from nexus_agent.eviction.policies.reservoir import ReservoirPolicy
from nexus_agent.eviction.policies.snapkv import SnapKVPolicy
from nexus_agent.eviction.policies.streaming import StreamingPolicy
from nexus_agent.eviction.policies.tova import TOVAPolicy
from nexus_agent.eviction.policy import Policy

POLICIES: list[type[Policy]] = [
    FullPolicy, StreamingPolicy, H2OPolicy, SnapKVPolicy, TOVAPolicy,
    KnormPolicy, KeyDiffPolicy, CapKVPolicy, ReservoirPolicy, CertifiedPolicy,
]


def make_policy(name: str, **kwargs) -> Policy:
    """Instantiate a registered policy by name; a ValueError lists the names when it is unknown."""
    for cls in POLICIES:
        if cls.name == name:
            return cls(**kwargs)
    raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(c.name for c in POLICIES)}")
