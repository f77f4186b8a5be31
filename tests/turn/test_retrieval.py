"""Conversation-aware retrieval (nexus_agent.turn.retrieval): a follow-up that names no tool is retrieved with
the earlier turn, and the turn's tool results reach the joint query; the real MiniLM router over real tools."""

from __future__ import annotations

import pytest

from nexus_agent.turn.retrieval import retrieve, turn_queries
from registry.model import Tool

TOOLS = [Tool.from_mcp({"name": n, "description": d, "inputSchema": {"type": "object", "properties": p}})
         for n, d, p in (
             ("get_weather", "Get the current weather forecast for a city.", {"city": {"type": "string"}}),
             ("git_log", "Show the commit log of a git repository.", {"repo_path": {"type": "string"}}),
             ("send_email", "Send an email to a recipient.", {"to": {"type": "string"}}),
             ("convert_currency", "Convert an amount between two currencies.", {"amount": {"type": "number"}}),
             ("play_music", "Play a song or playlist.", {"song": {"type": "string"}}),
         )]
FOLLOW_UP = [{"role": "user", "content": "What's the weather like in London today?"},
             {"role": "assistant", "content": "It is 14 degrees and cloudy in London."},
             {"role": "user", "content": "Do the same for Paris."}]


def test_queries_join_the_earlier_turn_and_the_turn_results():
    assert turn_queries([{"role": "user", "content": "hi"}]) == ["hi"]
    assert turn_queries(FOLLOW_UP) == ["Do the same for Paris.",
                                       "What's the weather like in London today?\nDo the same for Paris."]
    with_result = FOLLOW_UP + [{"role": "assistant", "content": "", "tool_calls": []},
                               {"role": "tool", "content": "Paris: 18 degrees, sunny"}]
    assert turn_queries(with_result)[1].endswith("Do the same for Paris.\nParis: 18 degrees, sunny")
    assert turn_queries([{"role": "system", "content": "s"}]) == []


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    from slb.build import build_buffer
    from slb.embedder import Embedder
    from slb.service import open_router
    from slb.tools import as_entry

    path = tmp_path_factory.mktemp("retrieval") / "b.slb"
    build_buffer(TOOLS, Embedder(), path)
    return open_router("gate", tools=[as_entry(t) for t in TOOLS], path=path)


def test_a_follow_up_is_retrieved_with_the_earlier_turn(router):
    alone = router.route("Do the same for Paris.")
    joint = retrieve(router, FOLLOW_UP)
    assert joint.candidates[0][0] == "get_weather"  # the earlier turn names the job
    weather = {c[0]: c[1] for c in alone.candidates}["get_weather"]
    assert joint.candidates[0][1] > weather  # better evidence than the follow-up's own words
    assert joint.score == alone.score and joint.margin == alone.margin  # the gate's evidence: the last message
