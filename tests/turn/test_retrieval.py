"""Conversation-aware retrieval (nexus_agent.turn.retrieval): a follow-up that names no tool is retrieved with
the earlier turn, and the turn's tool results reach the joint query; a request in steps is not one tool the gate
is sure of, and each sure step's pick is shown; the real MiniLM router over real tools."""

from __future__ import annotations

import pytest

from nexus_agent.turn.retrieval import make_room, retrieve, split_steps, steps_left, turn_queries
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


def test_a_name_is_weighed_by_its_score_for_the_last_message(router):
    """The earlier turn brings its tool in and ranks it, but a name's evidence is the last message's own score:
    a new request after an earlier turn must not have the earlier turn's tool weighed for it."""
    from nexus_agent.turn.decide import top_k
    from nexus_agent.turn.profile import DecideProfile

    new_topic = FOLLOW_UP[:2] + [{"role": "user", "content": "Send an email to bob@example.org saying hi."}]
    joint, alone = retrieve(router, new_topic), router.route(new_topic[-1]["content"])
    own = {c[0]: c[1] for c in alone.candidates}
    assert joint.own == own and any(c[1] > own[c[0]] for c in joint.candidates)  # merged: weather scores higher
    by_name = {t.name: t for t in TOOLS}
    for profile in (DecideProfile(k=3), DecideProfile(fit_all=10)):  # the top k, and every tool shown
        shown = top_k(joint, by_name, profile, len(TOOLS))
        assert {c.name: c.score for c in shown} == {c.name: own[c.name] for c in shown}


def test_a_call_takes_the_step_where_its_tool_ranks_best():
    steps = [["convert_time", "get_current_time", "git_log"], ["git_log", "git_show", "git_commit"]]
    assert steps_left(steps, []) == steps
    assert steps_left(steps, ["get_current_time"]) == steps[1:]
    assert steps_left(steps, ["git_log"]) == steps[:1]  # first in the second step, third in the first
    assert steps_left(steps, ["git_log", "git_log"]) == []  # the second call takes the step left
    assert steps_left(steps, ["git_status"]) == steps  # among no step's candidates: takes none
    same = [["a", "b"], ["a", "b"]]
    assert steps_left(same, ["a"]) == same[1:] and steps_left(same, ["a", "b"]) == []


def test_make_room_shows_each_pick_in_the_first_k():
    cands = [(n, 1.0 - i / 10) for i, n in enumerate("abcdef")]
    assert make_room(cands, [("b", 0.5)], "a", 3) == cands  # shown already: stays where it is
    got = make_room(cands, [("e", 0.6), ("f", 0.5)], "a", 3)
    assert [c[0] for c in got] == ["a", "f", "e", "d", "c", "b"]  # the weakest shown give way, to the end
    assert got[2] == ("e", 0.6)  # the step's own candidate (its score)
    two = make_room(cands, [("e", 0.6), ("f", 0.5)], "a", 2)
    assert [c[0] for c in two] == ["a", "e", "c", "d", "f", "b"]  # no room left for f
    assert [c[0] for c in make_room(cands[:2], [("x", 0.3)], "a", 3)] == ["a", "b", "x"]  # room left: appended
    assert make_room(cands, [], "a", 3) == cands


def test_a_request_in_steps_is_not_one_tool_the_gate_is_sure_of(router):
    steps = "Send an email to bob@example.org saying hi, then play the song Yesterday"
    assert split_steps(steps, 8) == ["Send an email to bob@example.org saying hi", "play the song Yesterday"]
    whole = router.route(steps)
    assert (whole.tool, whole.path) == ("play_music", "auto"), whole  # sure of one step's tool
    assert [router.route(s).path for s in split_steps(steps, 8)] == ["auto", "auto"]
    got = retrieve(router, [{"role": "user", "content": steps}], k=2)
    assert got.path == "rerank" and got.tool == "play_music"  # the model sees the top k, not the pick alone
    assert {c[0] for c in got.candidates[:2]} == {"play_music", "send_email"}, got.candidates
    assert got.score == whole.score and got.margin == whole.margin
    assert [s[0] for s in got.steps] == ["send_email", "play_music"] and all(len(s) == 3 for s in got.steps)
    assert steps_left(got.steps, ["play_music"]) == got.steps[:1]  # a further call chooses among the email step's

    one = "Play the song Yesterday by the Beatles"
    alone = router.route(one)
    assert alone.path == "auto" and retrieve(router, [{"role": "user", "content": one}], k=2).path == "auto"
