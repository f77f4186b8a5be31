"""The OpenAI chat-completions wire format for `nexus serve`: request checking, message rendering, reply shapes.

`parse_request(body, model_ids)` turns a decoded JSON body into a `ChatRequest` or raises `ApiError` (HTTP
status + OpenAI's `{"error": {"message", "type", "param", "code"}}`). Each OpenAI tool becomes a registry
`Tool` (so the same meta-schema validation applies: a bad schema is a 400 naming the tool and the JSON path),
cached by the hash of its JSON so a repeated tool list is not validated again. `render_messages` turns the
conversation, tool calls and tool results included, into plain chat turns the model's template renders;
`completion` / `chunk` build the response objects; `StopText` holds back text that may start a stop string.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4


class ApiError(Exception):
    """An error reply: HTTP `status` and OpenAI's error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


@dataclass
class ChatRequest:
    """A checked chat-completions request. tool_choice: "auto" | "none" | "required" | a function name;
    json_schema: the schema `response_format` asks for (json_object: `{"type": "object"}`), None for text;
    max_tokens: None when the client set no limit."""

    model: str
    messages: list[dict]
    tools: list = field(default_factory=list)  # registry Tools, in request order
    tool_choice: str = "auto"
    named: bool = False  # tool_choice names a function
    parallel_tool_calls: bool = True
    json_schema: dict | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    stream: bool = False
    include_usage: bool = False


class ToolCache:
    """OpenAI tool JSON -> validated registry Tool, an LRU keyed by the sha256 of the tool's canonical JSON."""

    def __init__(self, size: int = 8192):
        self.size, self.items, self.hits, self.misses = size, OrderedDict(), 0, 0

    def get(self, index: int, tool: Any):
        from registry.model import Tool, ToolValidationError

        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{where}.function must be an object with a string name", f"{where}.function")
        key = hashlib.sha256(json.dumps(fn, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        if key in self.items:
            self.hits += 1
            self.items.move_to_end(key)
            return self.items[key]
        self.misses += 1
        params = fn.get("parameters")
        if params is None or params == {}:  # omitted (OpenAI: an empty parameter list) or the empty schema
            params = {"type": "object", "properties": {}}
        elif isinstance(params, dict) and "type" not in params and ("properties" in params or "required" in params):
            params = {"type": "object", **params}  # an object schema that leaves its type implied
        try:
            out = Tool.from_mcp({"name": fn["name"], "description": fn.get("description") or "", "inputSchema": params})
        except ToolValidationError as e:
            path = e.path.replace("$.inputSchema", f"$.tools[{index}].function.parameters")
            raise bad(f"tool {e.tool!r}: {path}: {e.message} [rule: {e.rule}]", f"{where}.function.parameters",
                      "invalid_tool_schema") from None
        self.items[key] = out
        if len(self.items) > self.size:
            self.items.popitem(last=False)
        return out


def _number(body: dict, key: str, default, lo: float, hi: float, kind=float):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise bad(f"{key} must be {'an integer' if kind is int else 'a number'}, got {json.dumps(v)}", key)
    if not lo <= v <= hi:
        raise bad(f"{key} must be between {lo} and {hi}, got {v}", key)
    return kind(v)


def content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of `{"type": "text", "text": ...}` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise bad(f"{where}.content[{i}]: only text parts are supported", f"{where}.content")
            parts.append(p["text"])
        return "".join(parts)
    raise bad(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def _messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty list of chat messages", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        msg = {"role": m["role"], "content": content_text(m.get("content"), where)}
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls:
            if not isinstance(calls, list):
                raise bad(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
            msg["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad(f"{where}.tool_calls[{j}].function.name is missing", f"{where}.tool_calls")
                args = fn.get("arguments", "")
                msg["tool_calls"].append({"id": str(c.get("id", "")), "type": "function", "function": {
                    "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
        if m["role"] == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id", ""))
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        out.append(msg)
    return out


def _logit_bias(raw: Any) -> dict[int, float]:
    """OpenAI's `logit_bias`: {"token id": bias in [-100, 100]} (the ids are the model's own)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise bad('logit_bias must be an object {"token id": bias}', "logit_bias")
    out = {}
    for k, v in raw.items():
        if not (isinstance(k, str) and k.isdigit()):
            raise bad(f"logit_bias keys must be token ids, got {json.dumps(k)}", "logit_bias")
        out[int(k)] = _number({"logit_bias": v}, "logit_bias", 0.0, -100.0, 100.0)
    return out


def _response_format(rf: Any) -> dict | None:
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema must be a JSON Schema object",
                      "response_format.json_schema.schema")
        from jsonschema import validators
        from jsonschema.exceptions import SchemaError

        try:
            validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(schema)
        except SchemaError as e:
            path = "$" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in e.absolute_path)
            raise bad(f"response_format.json_schema.schema is not valid JSON Schema at {path}: {e.message}",
                      "response_format.json_schema.schema") from None
        return schema
    raise bad('response_format.type must be "text", "json_object" or "json_schema"', "response_format")


def parse_request(body: Any, model_ids: set[str], cache: ToolCache) -> ChatRequest:
    """A checked `ChatRequest` from a decoded JSON body; ApiError names the offending field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model is required (see GET /v1/models)", "model")
    if model not in model_ids:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {', '.join(sorted(model_ids))}",
                       "invalid_request_error", "model", "model_not_found")
    if "messages" not in body:
        raise bad("messages is required", "messages")
    req = ChatRequest(model=model, messages=_messages(body["messages"]))
    if body.get("n") not in (None, 1):
        raise bad("only n=1 is supported", "n")
    for legacy, current in (("functions", "tools"), ("function_call", "tool_choice")):
        if body.get(legacy) is not None:  # served without them, a legacy client would get no call and no error
            raise bad(f"{legacy} is OpenAI's deprecated form: send {current} (a function tool: "
                      '{"type": "function", "function": {...}})', legacy)
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise bad("tools must be a list", "tools")
    req.tools = [cache.get(i, t) for i, t in enumerate(raw_tools)]
    names = [t.name for t in req.tools]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise bad(f"two tools are called {dup!r}", "tools")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise bad(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
        req.tool_choice, req.named = name, True
    elif choice in (None, "auto", "none", "required"):
        req.tool_choice = choice or "auto"
        if req.tool_choice == "required" and not req.tools:
            raise bad('tool_choice "required" needs tools', "tool_choice")
    else:
        raise bad('tool_choice must be "auto", "none", "required" or {"type": "function", ...}', "tool_choice")
    req.parallel_tool_calls = bool(body.get("parallel_tool_calls", True))
    req.json_schema = _response_format(body.get("response_format"))
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    req.max_tokens = _number({key: limit}, key, None, 1, 1 << 20, int)
    req.temperature = _number(body, "temperature", 0.0, 0.0, 2.0)
    req.top_p = _number(body, "top_p", 1.0, 1e-9, 1.0)
    req.seed = _number(body, "seed", None, -(1 << 63), (1 << 64) - 1, int)
    if req.seed is not None:
        req.seed %= 1 << 63
    req.presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    req.frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    req.logit_bias = _logit_bias(body.get("logit_bias"))
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise bad(f"stop must be a string or a list of at most {MAX_STOP} non-empty strings", "stop")
    req.stop = stop
    req.stream = bool(body.get("stream", False))
    opts = body.get("stream_options") or {}
    req.include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    return req


# -- the conversation as chat turns ----------------------------------------------------------------------------
def tool_names(messages: list[dict]) -> dict[str, str]:
    """tool_call_id -> function name, from the assistant turns' tool calls."""
    return {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls", ())}


def result_text(message: dict, names: dict[str, str]) -> str:
    """A tool result as the plain text turn it becomes: "Tool NAME returned: ..."."""
    name = message.get("name") or names.get(message.get("tool_call_id", ""), "the tool")
    return f"Tool {name} returned: {message['content']}"


def render_messages(messages: list[dict]) -> list[dict]:
    """Plain {"role", "content"} turns any chat template renders: developer -> system; an assistant tool call
    -> an assistant turn "Calling NAME(ARGS)"; a tool result -> a user turn "Tool NAME returned: ..."."""
    names = tool_names(messages)
    out = []
    for m in messages:
        role, text = m["role"], m["content"]
        if role == "developer":
            role = "system"
        elif role == "tool":
            role, text = "user", result_text(m, names)
        elif m.get("tool_calls"):
            calls = "\n".join(f"Calling {c['function']['name']}({c['function']['arguments']})" for c in m["tool_calls"])
            text = f"{text}\n{calls}".strip()
        out.append({"role": role, "content": text})
    return out


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as chat templates with a tools section take them (Hugging Face's convention): developer ->
    system, an assistant's tool calls with their arguments as objects (rendered as the text they were sent as),
    tool results as role "tool"."""
    from native.chat_template import JsonText

    out = []
    for m in messages:
        m = dict(m, role="system") if m["role"] == "developer" else dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                args = c["function"].get("arguments") or "{}"
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    pass  # a client's own malformed text: shown as it was sent
                else:  # an object: shown as the text it was sent as (`JsonText`)
                    text = c["function"].get("arguments")
                    if isinstance(args, dict) and isinstance(text, str) and text.strip() == text:
                        args = JsonText(args, text)
                calls.append({**c, "function": {**c["function"], "arguments": args}})
            m["tool_calls"] = calls
        out.append(m)
    return out


# -- reply shapes ----------------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(cid: str, model: str, created: int, content: str | None, tool_calls: list[dict], finish: str,
               use: dict) -> dict:
    """A `chat.completion` object."""
    message = {"role": "assistant", "content": content if not tool_calls else (content or None), "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": use, "system_fingerprint": None}


def chunk(cid: str, model: str, created: int, delta: dict | None, finish: str | None = None,
          use: dict | None = None, include_usage: bool = False) -> dict:
    """A `chat.completion.chunk`; `delta` None makes the final usage chunk (no choices)."""
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "system_fingerprint": None,
           "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish,
                                                 "logprobs": None}]}
    if include_usage:
        out["usage"] = use
    return out


def now() -> int:
    return int(time.time())


class StopText:
    """Streamed text with stop strings: `feed(piece)` returns what may be shown now, holding back a tail that
    could be the start of a stop string; `hit` is set once one appears (the text before it is shown)."""

    def __init__(self, stops: list[str]):
        self.stops, self.pending, self.hit = stops, "", False

    def feed(self, piece: str) -> str:
        if not self.stops:
            return piece
        self.pending += piece
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit, out, self.pending = True, self.pending[:cut], ""
            return out
        keep = max((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        out, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
