"""The agent end to end on the packaged model and the real probe MCP server (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
NEXUS = [sys.executable, "-m", "nexus_agent.cli"]


def test_nexus_run_calls_real_server_with_schema_valid_args(probe_store, nexus_home, tmp_path):
    trace = tmp_path / "trace.jsonl"
    env = {**os.environ, "NEXUS_HOME": str(nexus_home), "NEXUS_THREADS": "1"}
    p = subprocess.run([*NEXUS, "run", "Record the sum of 12 and 30", "--trace", str(trace), "--max-tokens", "24"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    calls = [json.loads(x) for x in (nexus_home / "probe_calls.jsonl").read_text().splitlines()]
    assert len(calls) == 1 and calls[0]["tool"] == "record_sum"
    jsonschema.validate(calls[0]["arguments"], probe_store.get_tool("record_sum").input_schema)
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    kinds = {e["event"] for e in events}
    assert {"turn", "route", "args", "tool_call", "answer", "memory"} <= kinds
    call = next(e for e in events if e["event"] == "tool_call")
    assert call["status"] == "ok" and call["arguments"] == calls[0]["arguments"]
    assert "record_sum" in p.stdout


@pytest.fixture
def agent(probe_store, llamacpp_backend):
    from nexus_agent.loop import Agent, AgentConfig
    from nexus_agent.servers import ServerPool, ServerPoolConfig
    from nexus_agent.session import ensure_router

    tools = {t.name: t for t in probe_store.list_tools()}
    pool = ServerPool.from_store(probe_store, ServerPoolConfig(call_timeout_s=2.0))
    a = Agent(llamacpp_backend, ensure_router(probe_store), tools, pool,
              AgentConfig(max_answer_tokens=8, n_ctx=2048))
    yield a
    a.live.close()
    pool.close()


def test_crash_hang_and_invalid_output_are_observations_and_session_continues(agent, probe_store, nexus_home):
    crash = agent.call_step(probe_store.get_tool("crash_once"), "crash the server once")
    assert crash.observation.status == "ok" and crash.observation.restarted  # restarted once, call retried

    hang = agent.call_step(probe_store.get_tool("sleep_for"), "sleep for 60 seconds")
    assert hang.arguments is not None
    if hang.arguments["seconds"] >= 2:  # the model chose a long sleep: the call must be abandoned
        assert hang.observation.status == "timeout" and "did not answer" in hang.observation.text

    agent.config.max_arg_tokens = 2  # the model cannot finish the JSON even in 4x the budget: a named miss
    bad = agent.call_step(probe_store.get_tool("record_sum"), "record the sum of 1 and 2")
    assert bad.arguments is None and bad.observation.status == "invalid_arguments"
    assert "missing (the arguments were cut at the token limit)" in bad.observation.text
    args = agent.trace.of("args")[-2:]
    assert [e["source"] for e in args] == ["signature", "full_schema"]
    assert all(e["extended"] and e["tokens"] == 8 for e in args)  # each went on to the larger budget

    agent.config.max_arg_tokens = 160  # the same session goes on and serves a normal turn
    turn = agent.run_turn("Record the sum of 5 and 6")
    assert [c.tool for c in turn.calls] == ["record_sum"] and turn.calls[0].observation.ok
    assert json.loads(turn.calls[0].observation.text) == {"sum": sum(turn.calls[0].arguments.values())}
    assert turn.answer


def test_router_mode_calls_a_request_that_names_no_value_only_above_its_floor(agent, nexus_home):
    """SmolLM2 has no tools section: the router's pick stands, and a request naming no value needs the profile's
    `no_value_floor` ("Hi there! How are you today?" reached 0.20 against a weather tool on the held-out probe)."""
    from dataclasses import replace

    from nexus_agent.turn.profile import NO_VALUE_FLOOR

    assert agent.decider.profile.mode == "router" and agent.decider.profile.no_value_floor == NO_VALUE_FLOOR
    agent.decider.profile = replace(agent.decider.profile, no_value_floor=1.01)  # above any score: every one is
    turn = agent.run_turn("Record the sum of the two numbers")  # refused where the request names no value
    assert turn.calls == [] and turn.routes[0]["no_value"] and turn.routes[0]["path"] == "none"
    assert not (nexus_home / "probe_calls.jsonl").exists()
    turn = agent.run_turn("Record the sum of 5 and 6")  # values named: the floor does not apply
    assert [c.tool for c in turn.calls] == ["record_sum"] and turn.calls[0].observation.ok


def test_split_steps_and_validate():
    from nexus_agent.arguments.decoder import validate
    from nexus_agent.turn.retrieval import split_steps

    assert split_steps("add 2 and 3, then multiply 4 by 5; then say hi", 4) == [
        "add 2 and 3", "multiply 4 by 5", "say hi"]
    assert split_steps("a then b then c", 2) == ["a", "b then c"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert validate('{"a": 1}', schema) == ({"a": 1}, None)
    assert "schema" in validate('{"a": "x"}', schema)[1]
    assert "not valid JSON" in validate('{"a": ', schema)[1]
