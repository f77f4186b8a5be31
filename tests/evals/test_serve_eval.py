"""`nexus eval serve`: the call parser on replies Qwen2.5-Coder-0.5B wrote through llama_cpp.server (its own chat
template, captured in the committed run), and a tiny real run of the eval (nexus serve and the llama_cpp.server peer on
SmolLM2: one request at 10 tools, a 2-turn conversation, 2 streaming clients) for its JSON and table."""

from __future__ import annotations

import json

import pytest

from evals.serve_calls import parse_text_call

# What Qwen2.5-Coder-0.5B wrote through llama_cpp.server in stop 44's committed run (evals/report/serve_stop44.json):
# a fenced call, a bare call, and a bare call whose arguments are a JSON string; none used the template's <tool_call>
# tags.
FENCED = ('```json\n{\n  "name": "bank_account.transfer",\n  "arguments": {\n    "from_account": "123123",\n'
          '    "to_account": "123144",\n    "amount": 30\n  }\n}\n```')
BARE = '{"name": "identify_bird", "arguments": {"color": "green", "habitat": "forest", "size": "small"}}'
BARE_STRING_ARGS = ('{"name": "Travel_1_FindAttractions", "arguments": "{\\"category\\": \\"Museum\\", '
                    '\\"free_entry\\": false}"}')
CUT = ('```json\n{\n  "name": "SQLCompletionAnalyzer.makeProposalsFromObject",\n  "arguments": {\n    "object": {\n'
       '      "name": "Customers",\n      "properties": {\n        "id": {\n')  # max_tokens ran out


def test_calls_qwen_wrote_are_read_with_their_span():
    call = parse_text_call(FENCED)
    assert call.name == "bank_account.transfer" and (call.start, call.end) == (0, len(FENCED))
    assert json.loads(call.arguments) == {"from_account": "123123", "to_account": "123144", "amount": 30}
    call = parse_text_call(BARE + "\n")
    assert call.name == "identify_bird" and call.end == len(BARE)
    assert json.loads(call.arguments) == {"color": "green", "habitat": "forest", "size": "small"}
    assert json.loads(parse_text_call(BARE_STRING_ARGS).arguments) == {"category": "Museum", "free_entry": False}
    cut = parse_text_call(CUT)  # a call that never closed: bad JSON, no name
    assert cut is not None and cut.name is None and cut.arguments is None


def test_the_templates_tagged_call_and_text_without_a_call():
    tagged = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    text = "Sure.\n" + tagged + "\nDone"
    call = parse_text_call(text)
    assert (call.name, json.loads(call.arguments), text[call.start:call.end]) == ("add", {"a": 1, "b": 2}, tagged)
    assert parse_text_call('{"name": "add", "parameters": {"a": 1}}').arguments == '{"a": 1}'
    assert parse_text_call("The weather in Paris is sunny.") is None
    assert parse_text_call('The answer is {"a": 1} in JSON.') is None  # JSON inside an answer is not a call
    no_args = parse_text_call('<tool_call>\n{"name": "add", "arguments": "not json"}\n</tool_call>')
    assert no_args.name == "add" and no_args.arguments is None


@pytest.mark.slow
def test_tiny_run_json_and_table(routing_data, capsys):
    import argparse

    from evals import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    data = routing_data
    args = p.parse_args(["--catalog", str(data / "tools.jsonl"), "--queries", str(data / "queries.jsonl"),
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


def test_same_queries_ask_every_size_the_same_requests_among_its_own_distractors(routing_data):
    import argparse

    from evals import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    base = ["--catalog", str(routing_data / "tools.jsonl"), "--queries", str(routing_data / "queries.jsonl"),
            "--sizes", "10,50", "--requests", "3", "--turns", "0"]
    plan, _, _ = serve._workload(p.parse_args(base + ["--same-queries"]))
    small, large = plan[10], plan[50]
    assert [r["query"] for r in small] == [r["query"] for r in large] and len(small) == 3
    names = {n: {t["function"]["name"] for t in rows[0]["tools"]} for n, rows in plan.items()}
    golds = {r["gold"] for r in small}
    assert len(names[10]) == 10 and len(names[50]) == 50 and golds <= names[10] & names[50]
    assert names[10] & names[50] == golds  # each size its own distractors
    plan, _, _ = serve._workload(p.parse_args(base))  # the default: each size its own queries
    assert not {r["query"] for r in plan[10]} & {r["query"] for r in plan[50]}


def test_a_conversation_answers_every_call_a_reply_made():
    from evals.serve import _result_message

    two = {"tool": "get_weather", "arguments": '{"city": "Paris"}', "content": "",
           "calls": [["get_weather", '{"city": "Paris"}'], ["get_weather", '{"city": "London"}']]}
    assistant, *results = _result_message(3, two)
    sent = assistant["tool_calls"]
    assert [c["function"]["arguments"] for c in sent] == ['{"city": "Paris"}', '{"city": "London"}']
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in sent] and len({c["id"] for c in sent}) == 2
    assert all(r["role"] == "tool" and json.loads(r["content"])["result"] == "done (step 4)" for r in results)
    text_call = {"tool": "add", "arguments": '{"a": 1}', "content": '{"name": "add", ...}', "calls": []}
    assert len(_result_message(0, text_call)) == 2  # a call read from the text: one call, one result
    assert _result_message(0, {"tool": None, "arguments": None, "content": "Hello"}) == [
        {"role": "assistant", "content": "Hello"}]
