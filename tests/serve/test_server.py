"""`nexus serve` end to end: the official openai client and raw HTTP against a real server subprocess over the
packaged model (tests/serve/conftest.py)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import jsonschema
import numpy as np
import pytest
from serve_helpers import ADD, MULTIPLY, catalogue_tools, function, post, stats, stream_events

ASK = [{"role": "user", "content": "Add 12 and 30"}]


def test_models_and_a_streamed_answer_through_the_openai_client(client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Name three primary colors."}], max_tokens=24,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text.strip() and finishes in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + chunks[-1].usage.completion_tokens


def test_a_tool_call_among_250_tools_then_the_answer_from_its_result(client, serve_url):
    tools = catalogue_tools(249) + [ADD]
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=tools)
    choice = r.choices[0]
    assert r.object == "chat.completion" and choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, ADD["function"]["parameters"])
    assert args == {"a": 12, "b": 30}
    embedded = stats(serve_url)["tools_embedded"]
    again = client.chat.completions.create(model="smollm2", messages=ASK, tools=tools)  # the same list: cached
    assert again.choices[0].message.tool_calls[0].function.name == "add"
    assert stats(serve_url)["tools_embedded"] == embedded
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    final = client.chat.completions.create(model="smollm2", messages=history, tools=tools, max_tokens=32)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert not final.choices[0].message.tool_calls and final.choices[0].message.content.strip()


def test_a_streamed_tool_call_arrives_as_tool_call_deltas_while_decoded(client, serve_url):
    stream = client.chat.completions.create(model="smollm2", messages=ASK, tools=catalogue_tools(49) + [ADD],
                                            stream=True)
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
    head, pieces = calls[0], calls[1:]
    assert head.index == 0 and head.id and head.type == "function" and head.function.name == "add"
    assert head.function.arguments == ""
    assert len(pieces) >= 2 and all(p.index == 0 and p.id is None and p.function.name is None for p in pieces)
    args = json.loads("".join(p.function.arguments for p in pieces))
    jsonschema.validate(args, ADD["function"]["parameters"])
    assert args == {"a": 12, "b": 30} and deltas[-1].finish_reason == "tool_calls"
    # one piece per decoded token: the SSE events carry the model's own token pieces, not one JSON blob
    events = stream_events(serve_url, {"model": "smollm2", "messages": ASK, "tools": [ADD]})
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "add" and all("name" not in c["function"] for c in calls[1:])
    pieces = [c["function"]["arguments"] for c in calls[1:]]
    assert len(pieces) >= 6 and "".join(pieces) == json.dumps(args, separators=(",", ":"))


EMAIL = function("send_email", "Send an email to a recipient with a subject and a body.",
                 {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"},
                                                   "body": {"type": "string"}}, "required": ["to", "subject", "body"]})
MEETING = [{"role": "user", "content": "Email bob@example.com that the meeting moved to 3pm on Friday"}]


def test_arguments_that_cannot_validate_get_a_text_answer_naming_the_missing_value(client):
    # 12 tokens cannot hold the three required strings: the policy (signature, larger budget, full schema) ends in
    # a text answer that names what is missing, HTTP 200, never a server error
    r = client.chat.completions.create(model="smollm2", messages=MEETING, tools=[EMAIL], tool_choice="required",
                                       max_tokens=12)
    choice = r.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert "send_email" in choice.message.content and "'body' " in choice.message.content
    assert "missing" in choice.message.content
    streamed = client.chat.completions.create(model="smollm2", messages=MEETING, tools=[EMAIL],
                                              tool_choice="required", max_tokens=12, stream=True)
    deltas = [c.choices[0] for c in streamed if c.choices]
    text = "".join(d.delta.content or "" for d in deltas)
    assert "'body' " in text and deltas[-1].finish_reason == "length"  # the call streamed so far was cut


def test_tool_choice_none_named_and_required(client):
    tools = [ADD, MULTIPLY]
    plain = client.chat.completions.create(model="smollm2", messages=ASK, tools=tools, tool_choice="none",
                                           max_tokens=16)
    assert not plain.choices[0].message.tool_calls and plain.choices[0].finish_reason != "tool_calls"
    named = client.chat.completions.create(model="smollm2", messages=ASK, tools=tools,
                                           tool_choice={"type": "function", "function": {"name": "multiply"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "multiply"
    jsonschema.validate(json.loads(call.function.arguments), MULTIPLY["function"]["parameters"])
    chat = [{"role": "user", "content": "Hello! How are you today?"}]
    forced = client.chat.completions.create(model="smollm2", messages=chat, tools=tools, tool_choice="required")
    assert forced.choices[0].finish_reason == "tool_calls" and forced.choices[0].message.tool_calls


def test_an_empty_schema_and_one_that_leaves_object_implied_are_tools_of_an_object(client, serve_url):
    """OpenAI's `parameters` may be omitted (an empty parameter list); frameworks also send `{}` and a schema with
    properties but no `"type": "object"`: each is a tool over an object, called with schema-valid arguments; a
    root that is not an object stays a 400 naming it."""
    bare = {"type": "function", "function": {"name": "ping", "description": "Ping the service", "parameters": {}}}
    implied = {"type": "function", "function": {"name": "echo", "description": "Echo a text", "parameters": {
        "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    for tool, want in ((bare, {"type": "object", "properties": {}}),
                       (implied, {"type": "object", **implied["function"]["parameters"]})):
        r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Echo 'hi' back"}],
                                           tools=[bare, implied], tool_choice={"type": "function", "function": {
                                               "name": tool["function"]["name"]}}, max_tokens=32)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == tool["function"]["name"]
        jsonschema.validate(json.loads(call.function.arguments), want)
    array = {"type": "function", "function": {"name": "list", "parameters": {"type": "array"}}}
    e = _error(post(serve_url, {"model": "smollm2", "messages": ASK, "tools": [array]}), 400, "invalid_tool_schema")
    assert "$.tools[0].function.parameters.type" in e["message"]


def test_logit_bias_and_the_penalties_steer_the_answer(client, serve_url):
    """OpenAI's `logit_bias` (token ids of the model's own vocabulary) and presence / frequency penalties over the
    reply's own tokens; a bias on an id outside the vocabulary is a 400 naming it."""
    from native.generate import penalties

    logits = penalties(presence=1.0, frequency=0.5, bias={7: 3.0})([3, 3, 5], np.zeros(8, np.float32))
    assert logits.tolist() == [0, 0, 0, -2.0, 0, -1.5, 0, 3.0]  # once per token seen, then per time seen
    from native.tokenizer import load_tokenizer

    tok = load_tokenizer()
    (banana,) = tok.encode(" banana")
    ask = [{"role": "user", "content": "Name a fruit."}]

    def answer(**kw):
        return client.chat.completions.create(model="smollm2", messages=ask, max_tokens=12, **kw).choices[0]

    forced = answer(logit_bias={str(banana): 100})
    assert forced.message.content.split() == ["banana"] * 12  # every token the biased one
    plain = answer()
    first = tok.encode(plain.message.content)[0]
    assert tok.encode(answer(logit_bias={str(first): -100}).message.content)[0] != first
    repeat = [{"role": "user", "content": "Write the word cat ten times, separated by spaces."}]

    def most_repeated(**kw):
        text = client.chat.completions.create(model="smollm2", messages=repeat, max_tokens=24, **kw)
        return max(Counter(tok.encode(text.choices[0].message.content)).values())
    assert most_repeated(frequency_penalty=2.0) < most_repeated()  # measured: 2 vs 4
    e = _error(post(serve_url, {"model": "smollm2", "messages": ask, "logit_bias": {"99999999": 5}}), 400,
               param="logit_bias")
    assert "99999999" in e["message"]
    _error(post(serve_url, {"model": "smollm2", "messages": ask, "logit_bias": {"cat": 5}}), 400, param="logit_bias")


def test_response_format_json_schema_gives_schema_valid_json(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "country": {"type": "string", "maxLength": 40}},
              "required": ["city", "country"]}
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give the capital of France and its country."}],
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}}, max_tokens=60)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give the capital of Italy as JSON."}],
        response_format={"type": "json_object"}, max_tokens=60)
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)


def _error(status_body, status, code=None, param=None):
    got, body = status_body
    assert got == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]


def test_bad_requests_get_openai_error_shapes(serve_url):
    _error(post(serve_url, b'{"model": "smollm2", "messages": ['), 400, "invalid_json")
    _error(post(serve_url, {"model": "gpt-9", "messages": ASK}), 404, "model_not_found", "model")
    _error(post(serve_url, {"model": "smollm2"}), 400, param="messages")
    _error(post(serve_url, {"model": "smollm2", "messages": []}), 400, param="messages")
    bad_tool = {"type": "function", "function": {"name": "broken", "parameters": {
        "type": "object", "properties": {"x": {"type": "strnig"}}}}}
    e = _error(post(serve_url, {"model": "smollm2", "messages": ASK, "tools": [ADD, bad_tool]}), 400,
               "invalid_tool_schema")
    assert "'broken'" in e["message"] and "$.tools[1].function.parameters.properties.x.type" in e["message"]
    long = [{"role": "user", "content": "word " * 5000}]
    _error(post(serve_url, {"model": "smollm2", "messages": long}), 400, "context_length_exceeded")
    _error(post(serve_url, {"model": "smollm2", "messages": ASK}, key=None), 401, "invalid_api_key")
    _error(post(serve_url, {"model": "smollm2", "messages": ASK}, key="sk-wrong"), 401, "invalid_api_key")
    _error(post(serve_url, b"{" + b" " * (1 << 20) + b"}"), 413, "request_too_large")
    _error(post(serve_url, {"model": "smollm2", "messages": ASK, "temperature": "hot"}), 400, param="temperature")
    legacy = _error(post(serve_url, {"model": "smollm2", "messages": ASK, "functions": [ADD["function"]]}), 400,
                    param="functions")  # the deprecated form: served without it, the client would get no call
    assert "send tools" in legacy["message"]
    _error(post(serve_url, {"model": "smollm2", "messages": ASK, "function_call": "auto"}), 400, param="function_call")
    _error(post(serve_url, {}, path="/v1/nope"), 404, "not_found")
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{serve_url}/v1/nexus/stats", timeout=10)
    assert denied.value.code == 401
    with urllib.request.urlopen(f"{serve_url}/health", timeout=10) as r:
        assert json.load(r)["status"] == "ok"  # the health check needs no key
    ok, _ = post(serve_url, {"model": "smollm2", "messages": ASK, "max_tokens": 4})
    assert ok == 200  # the errors above left the server serving


def test_concurrent_clients_all_get_answers_and_a_dropped_stream_frees_its_slot(serve_url):
    long = {"model": "smollm2", "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_tokens": 400}
    dropped = stream_events(serve_url, long, close_after=3)
    assert len(dropped) == 3
    results, errors = {}, []

    def ask(i):
        try:
            body = {"model": "smollm2", "messages": [{"role": "user", "content": f"Say the number {i}."}],
                    "max_tokens": 12}
            results[i] = stream_events(serve_url, body)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and sorted(results) == [0, 1, 2]
    assert all(r[-1] == "[DONE]" and json.loads(r[-2])["choices"][0]["finish_reason"] for r in results.values())
    deadline = time.monotonic() + 10
    while (s := stats(serve_url))["jobs"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert s["jobs"] == s["active"] == s["queued"] == 0 and s["cancelled"] >= 1


@pytest.mark.parametrize("stops,piece,shown", [(["END"], ["abc E", "N", "D tail"], "abc "),
                                                (["x"], ["no stop here"], "no stop here")])
def test_stop_strings_hold_back_a_possible_start(stops, piece, shown):
    from nexus_agent.openai_api import StopText

    s = StopText(stops)
    out = "".join(s.feed(p) for p in piece)
    assert out + ("" if s.hit else s.flush()) == shown


def test_steps_are_called_one_per_reply_or_all_at_once(client):
    ask = [{"role": "user", "content": "Add 12 and 30, then multiply the result by 3"}]
    tools = [ADD, MULTIPLY] + catalogue_tools(20)
    both = client.chat.completions.create(model="smollm2", messages=ask, tools=tools).choices[0].message.tool_calls
    assert [c.function.name for c in both] == ["add", "multiply"] and len({c.id for c in both}) == 2
    first = client.chat.completions.create(model="smollm2", messages=ask, tools=tools, parallel_tool_calls=False)
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "add"
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    second = client.chat.completions.create(model="smollm2", messages=history, tools=tools, parallel_tool_calls=False)
    (call,) = second.choices[0].message.tool_calls
    assert call.function.name == "multiply"
    assert json.loads(call.function.arguments) == {"x": 42, "y": 3}  # 42 copied from the tool result
