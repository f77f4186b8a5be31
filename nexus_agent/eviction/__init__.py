"""KV cache eviction (DESIGN §7): policies, the evicting MLX session, certificate, disk tier, positional path."""

from nexus_agent.eviction.config import EvictionConfig
from nexus_agent.eviction.policies import POLICIES, make_policy
from nexus_agent.eviction.positional import POSITIONAL_POLICIES, evict_positional
from nexus_agent.eviction.session import EvictingSession

__all__ = ["POLICIES", "POSITIONAL_POLICIES", "EvictingSession", "EvictionConfig", "evict_positional", "make_policy"]
