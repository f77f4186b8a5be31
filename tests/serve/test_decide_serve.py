"""`nexus serve` over the packaged tool-trained Qwen2.5-Coder-0.5B: the model decides among the retrieved
candidates, so a conversational turn among 250 tools is answered in text, and a request a tool fits is a call
of it, through the official openai client."""

from __future__ import annotations

import json

import pytest
from serve_helpers import ADD, API_KEY, catalogue_tools, function

pytestmark = pytest.mark.slow

TIME = function("get_current_time", "Get the current time in a specific IANA timezone.",
                {"type": "object", "properties": {"timezone": {"type": "string", "description":
                 "IANA timezone name (e.g. 'America/New_York', 'Europe/London')"}}, "required": ["timezone"]})


@pytest.fixture(scope="module")
def qwen_client(qwen_serve_url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{qwen_serve_url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    return client, client.models.list().data[0].id


def test_a_conversational_turn_among_250_tools_is_answered_in_text(qwen_client):
    tools = catalogue_tools(248) + [ADD, TIME]
    client, model = qwen_client
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Thanks, that's all I needed."}], tools=tools, max_tokens=24)
    choice = r.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length")
    assert choice.message.content.strip()


def test_a_fitting_tool_among_250_is_called_with_the_request_values(qwen_client):
    tools = catalogue_tools(248) + [ADD, TIME]
    client, model = qwen_client
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What time is it in Tokyo right now? Use Asia/Tokyo."}],
        tools=tools)
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1, [(c.function.name, c.function.arguments) for c in calls]
    (call,) = calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_current_time"
    assert json.loads(call.function.arguments) == {"timezone": "Asia/Tokyo"}


def test_the_decided_call_streams_its_arguments_while_decoded(qwen_client):
    client, model = qwen_client
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What time is it in Tokyo right now? Use Asia/Tokyo."}],
        tools=[ADD, TIME], stream=True)
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
    head, pieces = calls[0], calls[1:]
    assert head.index == 0 and head.id and head.type == "function" and head.function.name == "get_current_time"
    assert head.function.arguments == "" and len(pieces) >= 2 and all(p.id is None for p in pieces)
    assert json.loads("".join(p.function.arguments for p in pieces)) == {"timezone": "Asia/Tokyo"}
    assert deltas[-1].finish_reason == "tool_calls"


def test_a_decided_call_whose_arguments_cannot_validate_is_a_text_answer(qwen_client):
    client, model = qwen_client
    email = function("send_email", "Send an email to a recipient with a subject and a body.",
                     {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"},
                                                       "body": {"type": "string"}},
                      "required": ["to", "subject", "body"]})
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Email bob@example.com that the meeting moved to 3pm"}],
        tools=[email, TIME], tool_choice="required", max_tokens=10)
    choice = r.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert "send_email" in choice.message.content and "'body'" in choice.message.content
