"""One streamed chat request to an OpenAI-compatible server, timed, and the tool call read from its reply.

A server that parses calls sends them as `delta.tool_calls` (nexus serve, mlx_lm.server). One that does not
(llama_cpp.server rendering the GGUF's own template) streams the model's text, and the call is read from it the
way the model writes it: Qwen2.5's `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, or the fenced
or bare JSON object small models write instead. Either way the times are those of the chunks that carried the
call's first and last byte.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from dataclasses import dataclass

# Failure kinds, in the order tables list them.
FAILURES = ("overflow", "timeout", "http", "no_call", "bad_json")


@dataclass(frozen=True)
class TextCall:
    """A call found in a reply's text: the tool's name, its arguments as JSON text (None: not a JSON object), and
    the character span [start, end) of the call in the text."""

    name: str | None
    arguments: str | None
    start: int
    end: int


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?)\s*(?:```|$)", re.S)


def _call_object(text: str) -> tuple[dict | None, int]:
    """The first JSON object at the start of `text` and how many characters it took; (None, 0) when there is none."""
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None, 0
    return (value, end) if isinstance(value, dict) else (None, 0)


def parse_text_call(text: str) -> TextCall | None:
    """The first tool call written in `text`: tagged (`<tool_call>{...}</tool_call>`), fenced (```json {...}```) or a
    bare `{"name": ..., "arguments": ...}` object. None when the text holds no call; a call whose JSON does not
    parse has name None (bad JSON). `arguments` may be an object or a JSON string of one (`parameters` too)."""
    m = _TAGGED.search(text) or _FENCED.search(text)
    if m:
        body, start, end = m.group(1), m.start(), m.end()
    else:
        first = text.find("{")
        if first < 0 or text[:first].strip():  # a bare call is the whole reply, not JSON inside an answer
            return None
        body, start, end = text[first:], first, len(text)
    obj, used = _call_object(body)
    if obj is None:
        return TextCall(None, None, start, end)
    if not m:
        end = start + used
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return TextCall(name if isinstance(name, str) else None, None, start, end)
    if not isinstance(name, str) or not isinstance(args, dict):
        return TextCall(name if isinstance(name, str) else None, None, start, end)
    return TextCall(name, json.dumps(args), start, end)


def chat_request(port: int, body: dict, timeout: float) -> dict:
    """POST /v1/chat/completions on 127.0.0.1:`port`, streamed when body["stream"].

    Returns ms to the first byte of the first tool call and to its last byte (`first_tool_ms`, `complete_ms`), to
    the end of the reply (`end_ms`), the first call (`tool`, `arguments`; `parsed`: "structured" from
    delta.tool_calls or "text" from the content), every call as [name, arguments text] (`calls`), the content,
    and `failure` (a FAILURES kind, None when a call was made) with `error` text. `timeout` bounds the
    whole request in seconds."""
    out = {"first_tool_ms": None, "complete_ms": None, "end_ms": None, "tool": None, "arguments": None,
           "parsed": None, "finish": None, "content": "", "failure": None, "error": None, "calls": []}
    t0 = time.perf_counter()

    def ms() -> float:
        return (time.perf_counter() - t0) * 1e3

    marks: list[tuple[int, float]] = []  # (content length after a chunk, ms): when each content byte arrived
    tool_first = tool_last = None
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read().decode("utf-8", "replace")
            out["failure"] = "overflow" if _overflow(text) else "http"
            out["error"] = f"HTTP {resp.status}: {text[:300]}"
            return out
        if not body.get("stream"):
            choice = json.loads(resp.read())["choices"][0]
            out["end_ms"] = ms()
            message = choice["message"]
            out["finish"], out["content"] = choice.get("finish_reason"), message.get("content") or ""
            calls = message.get("tool_calls") or []
            if calls:
                tool_first = tool_last = out["end_ms"]
                out["calls"] = [[c["function"]["name"], c["function"]["arguments"]] for c in calls]
            marks.append((len(out["content"]), out["end_ms"]))
        else:
            for line in resp:
                if ms() > timeout * 1e3:
                    raise TimeoutError(f"no finished reply after {timeout:.0f} s")
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    text = json.dumps(event["error"])
                    out["failure"] = "overflow" if _overflow(text) else "http"
                    out["error"] = f"stream error: {text[:300]}"
                    break
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    for call in delta.get("tool_calls") or []:
                        fn, i = call.get("function") or {}, call.get("index", 0)
                        while len(out["calls"]) <= i:
                            out["calls"].append([None, ""])
                        each = out["calls"][i]
                        each[0] = each[0] or fn.get("name")
                        each[1] += fn.get("arguments") or ""
                        if i == 0:  # the first call's bytes are the ones timed
                            tool_first = tool_first if tool_first is not None else ms()
                            tool_last = ms()
                    if delta.get("content"):
                        out["content"] += delta["content"]
                        marks.append((len(out["content"]), ms()))
                    if choice.get("finish_reason"):
                        out["finish"] = choice["finish_reason"]
            out["end_ms"] = ms()
            if out["finish"] is None and out["failure"] is None:
                out["failure"] = "http"
                out["error"] = "the stream ended without a finish_reason (the server dropped it; see its log)"
        conn.close()
        out["tool"], args = out["calls"][0] if out["calls"] else (None, "")
    except (socket.timeout, TimeoutError) as e:
        out["failure"], out["error"] = "timeout", f"{type(e).__name__}: {e}"
        return out
    except (OSError, ValueError, KeyError, IndexError) as e:
        out["failure"], out["error"] = "http", f"{type(e).__name__}: {e}"
        return out
    if out["failure"]:
        return out
    if out["tool"]:
        out["parsed"], out["first_tool_ms"], out["complete_ms"] = "structured", tool_first, tool_last
        out["arguments"] = args if _is_object(args) else None
    elif (call := parse_text_call(out["content"])) is not None:
        out["parsed"], out["tool"], out["arguments"] = "text", call.name, call.arguments
        out["calls"] = [[call.name, call.arguments]]
        out["first_tool_ms"] = next(t for n, t in marks if n > call.start)
        out["complete_ms"] = next(t for n, t in marks if n >= call.end)
    if out["tool"] is None:
        out["failure"] = "bad_json" if out["parsed"] else "no_call"
    elif out["arguments"] is None:
        out["failure"] = "bad_json"
    return out


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _overflow(text: str) -> bool:
    return bool(re.search(r"context_length_exceeded|exceed(s)? context window|context length|too long", text, re.I))
