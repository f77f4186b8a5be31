"""An agent turn with the openai backend: routed locally, arguments from the server under the tool's schema,
the real probe MCP server called with them, the answer streamed back; no KV context is ever opened."""

from __future__ import annotations

import json

import jsonschema


def test_agent_turn_over_http_reaches_the_tool_with_schema_valid_args(openai_backend, probe_store, nexus_home):
    from nexus_agent.loop import Agent, AgentConfig
    from nexus_agent.servers import ServerPool, ServerPoolConfig
    from nexus_agent.session import ensure_router

    tools = {t.name: t for t in probe_store.list_tools()}
    pool = ServerPool.from_store(probe_store, ServerPoolConfig(call_timeout_s=5.0))
    streamed: list[tuple[str, str]] = []
    agent = Agent(openai_backend, ensure_router(probe_store), tools, pool, AgentConfig(max_answer_tokens=16),
                  on_text=lambda kind, piece: streamed.append((kind, piece)))
    try:
        # the capability decided which decoder runs (arguments.text_path): no session was opened
        assert type(agent.decoder).__name__ == "TextArgumentDecoder" and agent.live is None
        turn = agent.run_turn("Record the sum of 12 and 30")
    finally:
        agent.close()
    assert [c.tool for c in turn.calls] == ["record_sum"] and turn.calls[0].observation.ok
    calls = [json.loads(x) for x in (nexus_home / "probe_calls.jsonl").read_text().splitlines()]
    assert len(calls) == 1 and calls[0]["arguments"] == turn.calls[0].arguments
    jsonschema.validate(calls[0]["arguments"], probe_store.get_tool("record_sum").input_schema)
    assert json.loads(turn.calls[0].observation.text) == {"sum": sum(calls[0]["arguments"].values())}
    assert turn.answer and {k for k, _ in streamed} == {"args", "answer"}
    kinds = {e["event"] for e in agent.trace.events}
    assert {"turn", "route", "args", "tool_call", "answer"} <= kinds
    args_events = agent.trace.of("args")
    assert args_events and args_events[0]["source"] == "signature" and args_events[0]["valid"]
    assert not agent.trace.of("memory")  # nothing about a KV cache happened
