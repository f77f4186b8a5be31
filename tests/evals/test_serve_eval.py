"""`nexus eval serve`: the call parser on replies Qwen2.5-Coder-0.5B wrote through llama_cpp.server (its own chat
template, captured in an eval run), and a tiny real run of the eval (nexus serve and the llama_cpp.server peer on
SmolLM2: one request at 10 tools, a 2-turn conversation, 2 streaming clients) for its JSON and table."""

from __future__ import annotations

import json

import pytest

from evals.serve_calls import parse_text_call

QWEN_TAGGED = ('<tool_call>\n{"name": "get_synthetic_locations", "arguments": {"count": 5, "region": "Europe"}}\n'
               '</tool_call>')


def test_a_tagged_call_gives_name_arguments_and_span():
    text = "Sure.\n" + QWEN_TAGGED + "\nDone"
    call = parse_text_call(text)
    assert call.name == "get_synthetic_locations"
    assert json.loads(call.arguments) == {"count": 5, "region": "Europe"}
    assert text[call.start:call.end] == QWEN_TAGGED


def test_fenced_and_bare_calls_and_string_arguments():
    fenced = 'Here it is:\n```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```'
    assert (parse_text_call(fenced).name, json.loads(parse_text_call(fenced).arguments)) == ("add", {"a": 1, "b": 2})
    bare = '{"name": "add", "arguments": "{\\"a\\": 1}"} and then some text'
    call = parse_text_call(bare)
    assert call.name == "add" and json.loads(call.arguments) == {"a": 1} and bare[call.end:] == " and then some text"
    assert parse_text_call('{"name": "add", "parameters": {"a": 1}}').arguments == '{"a": 1}'


def test_text_without_a_call_and_broken_calls():
    assert parse_text_call("The weather in Paris is sunny.") is None
    assert parse_text_call('The answer is {"a": 1} in JSON.') is None  # JSON inside an answer is not a call
    truncated = parse_text_call('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b"')  # max_tokens cut it
    assert truncated is not None and truncated.name is None and truncated.arguments is None
    no_args = parse_text_call('<tool_call>\n{"name": "add", "arguments": "not json"}\n</tool_call>')
    assert no_args.name == "add" and no_args.arguments is None


@pytest.mark.slow
def test_tiny_run_json_and_table(routing_data, capsys):
    import argparse

    from evals import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    args = p.parse_args(["--catalog", str(routing_data / "tools.jsonl"), "--queries", str(routing_data / "queries.jsonl"),
                         "--model", "smollm2", "--servers", "nexus,llama_cpp", "--sizes", "10", "--requests", "1",
                         "--turns", "2", "--clients", "2", "--n-ctx", "4096", "--max-tokens", "64", "--timeout", "120"])
    r = serve.run(args)
    for name in ("nexus", "llama_cpp"):
        cell = r["servers"][name]["10"]
        assert set(cell) >= {"call_ms_p50", "first_byte_ms_p50", "tool_acc", "args_valid", "failed", "failures"}
        assert cell["requests"] == 1 and cell["failed"] + (cell["call_ms_p50"] is not None) == 1
        assert r["conversation"][name]["total_ms"] > 0 and len(r["conversation"][name]["turn_ms"]) == 2
        assert r["concurrent"][name]["requests"] == 2
    nexus = r["servers"]["nexus"]["10"]  # SmolLM2 through nexus serve: the router picks, arguments are decoded
    assert nexus["failed"] == 0 and nexus["first_byte_ms_p50"] <= nexus["call_ms_p50"]
    # SmolLM2's own template has no tools section: the peer's model is never shown the tools
    assert r["servers"]["llama_cpp"]["10"]["prompt_tokens"] < 200
    out = capsys.readouterr().out
    assert "| nexus | 10 |" in out and "| llama_cpp | 10 |" in out and "conversation total (ms)" in out
