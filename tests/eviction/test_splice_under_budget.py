"""A schema block spliced into a session kept under a KV budget (`nexus chat --kv-budget` on MLX): the evicting
session passes the splice through, and its logits are the plain session's."""

from __future__ import annotations

import numpy as np

from nexus_agent.eviction import EvictingSession, EvictionConfig, make_policy
from registry.model import Tool
from splice.compiler import compile_blocks
from splice.profile import SpliceProfile
from splice.splicer import splice_tool

TOOL = Tool.from_mcp({
    "name": "search_issues",
    "description": "Search the issue tracker of a repository and return matching issues, newest first.",
    "inputSchema": {"type": "object", "required": ["repo", "query"], "properties": {
        "repo": {"type": "string", "description": "owner/name of the repository"},
        "query": {"type": "string", "description": "words to match in titles and bodies"},
        "state": {"type": "string", "enum": ["open", "closed", "all"], "description": "which issues"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "most issues returned"}}},
})

def test_splice_into_an_evicting_session_matches_the_plain_one(mlx_backend, nexus_home):
    b = mlx_backend
    compile_blocks(b, [TOOL], progress=False)
    profile = SpliceProfile("mlx", b.info.fingerprint, curve=[[512, 16]], max_depth=512)
    prefix = b.tokenizer.encode("A short conversation before the tool is needed. " * 6)
    user = b.tokenizer.encode("Find open issues about the tokenizer in ml-explore/mlx")
    plain = b.new_session(n_ctx=1024)
    plain.prefill(prefix)
    want = splice_tool(plain, b, TOOL, depth=len(prefix), profile=profile)
    ref = plain.forward_logits(user)
    plain.close()
    s = EvictingSession(b.new_session(n_ctx=1024), make_policy("certified"), EvictionConfig(budget=4096, seed=0))
    s.prefill(prefix)
    got = splice_tool(s, b, TOOL, depth=len(prefix), profile=profile)
    assert got.fallback is None and got.plan == want.plan and got.redecoded == want.redecoded
    assert len(s.pi) == s.cache.length == s.n_past  # the spliced slots have per-slot state (π = 1)
    out = s.forward_logits(user)
    s.close()
    np.testing.assert_allclose(out, ref, atol=2e-3, rtol=0)
