"""The prompts the agent gives the model: compact (signature) argument prompt, full-schema prompt, answers.

The compact prompt carries one tool's compressed signature (registry.signature) and a short key to its
notation, never the full JSON Schema; the full-schema prompt carries the schema text itself (the segment a
splice block holds). Prompts are chat messages rendered with the model's own template.
"""

from __future__ import annotations

import json

SIGNATURE_KEY = (
    "Tool signatures read: name(param: type, optional?: type=default) — purpose. Types: str, int, num, bool, "
    "[T] list, {field: T} object, \"a\"|\"b\" one of the values."
)
ANSWER_SYSTEM = "You are a helpful assistant. Answer briefly, using the tool results when there are any."


def render_schema(tool) -> str:
    """The full-schema text for a tool: the segment a precompiled splice block holds (compact JSON)."""
    schema = json.dumps(tool.input_schema, separators=(",", ":"), sort_keys=True)
    return f"Tool {tool.name}: {tool.description.strip()}\nInput JSON Schema: {schema}"


def _with_results(request: str, results: list[str] | None) -> str:
    """The user turn of an argument prompt: the step, then the earlier calls of this turn and their results
    (a later step's arguments often come from them: "... then multiply the result by 3")."""
    if not results:
        return request
    return request + "\n\nEarlier results in this request:\n" + "\n".join(results)


def argument_messages(signature: str, request: str, results: list[str] | None = None) -> list[dict]:
    """Messages asking for one call's arguments from the compressed signature."""
    system = (f"{SIGNATURE_KEY}\nCall this tool: {signature}\n"
              "Reply with only the JSON object of its arguments, taking values from the request.")
    return [{"role": "system", "content": system}, {"role": "user", "content": _with_results(request, results)}]


def full_schema_messages(schema_text: str, request: str, problem: str | None = None,
                         results: list[str] | None = None) -> list[dict]:
    """Messages asking for the arguments with the tool's full schema in context (after a failed attempt)."""
    system = f"{schema_text}\nReply with only the JSON object of the arguments, taking values from the request."
    if problem:
        system += f"\nA previous attempt was rejected: {problem}"
    return [{"role": "system", "content": system}, {"role": "user", "content": _with_results(request, results)}]


def observation_text(tool: str, arguments: dict, status: str, text: str, limit: int = 600) -> str:
    """How a tool result (or failure) appears in the transcript."""
    body = text if len(text) <= limit else text[:limit] + " …(truncated)"
    args = json.dumps(arguments, separators=(",", ":"))
    if status == "ok":
        return f"Tool {tool}({args}) returned: {body}"
    return f"Tool {tool}({args}) failed [{status}]: {body}"


def answer_messages(request: str, observations: list[str], history: list[dict] | None = None) -> list[dict]:
    """Messages for the final answer of a turn, with the turn's tool observations."""
    msgs = [{"role": "system", "content": ANSWER_SYSTEM}, *(history or [])]
    content = request
    if observations:
        content += "\n\n" + "\n".join(observations)
    return msgs + [{"role": "user", "content": content}]


def baseline_messages(tools, request: str) -> list[dict]:
    """The concatenate-all-schemas baseline: every tool's full schema in the system prompt."""
    schemas = "\n\n".join(render_schema(t) for t in tools)
    system = (f"You can call these tools:\n\n{schemas}\n\n"
              "Reply with only the JSON object of the chosen tool's arguments.")
    return [{"role": "system", "content": system}, {"role": "user", "content": request}]


def decide_system(tools, fmt) -> str:
    """The system message that shows a model without a tools section in its template the candidate tools (as
    compressed signatures) and the call format (`nexus_agent.turn.call_format.NEXUS_FORMAT`)."""
    from registry.signature import compress

    sigs = "\n".join(compress(t) for t in tools)
    example = fmt.call_text("NAME", {"param": "value"})
    return (f"{SIGNATURE_KEY}\nYou can call these tools:\n{sigs}\n"
            f"To call one, reply with only:\n{example}\nOtherwise answer in plain text.")


def results_answer_messages(messages: list[dict]) -> list[dict]:
    """`answer_messages` for an OpenAI-style conversation whose last turn ends in tool results: the earlier turns
    as plain turns (`render_messages`), then the request with its results ("Tool NAME returned: ..."), the
    conversation's own system message kept before `ANSWER_SYSTEM`. The prompt a text answer after tool results
    is decoded on: shown the same results under its template's tools section, or after its calls as "Calling
    ..." turns, Qwen2.5-Coder-0.5B writes its calls out again or echoes the results; shown the request and its
    results together, it reports them ("The time in Tokyo is 2026-12-05 at 01:00:49+09:00. The last 3 commits
    ... are: ...")."""
    from nexus_agent.openai_api import render_messages, result_text, tool_names

    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    names = tool_names(messages)
    results = [result_text(m, names) for m in messages[last + 1:] if m["role"] == "tool"]
    plain = render_messages(messages[:max(last, 0)])
    system = plain.pop(0)["content"] if plain and plain[0]["role"] == "system" else ""
    out = answer_messages(messages[last]["content"] if last >= 0 else "", results, plain)
    if system:
        out[0] = {"role": "system", "content": f"{system}\n\n{out[0]['content']}"}
    return out
