"""How a model writes a tool call: read from its own chat template, or Nexus's format for a model without one.

A template with a tools section (Qwen2.5, Llama 3.1+, Mistral, Hermes-style) renders an assistant message's
`tool_calls` in the format the model was trained to write. Rendering one probe call (a name and an argument
object no template text contains) and cutting the result at the probe's pieces gives that format as three
texts: the opener up to the name (Qwen: `<tool_call>\\n{"name": "`), the text between the name and the argument
object (`", "arguments": `) and the closer (`}\\n</tool_call>`). The decision decodes exactly those pieces around
a name chosen among the candidates and arguments decoded under the tool's schema, so the format is certain
whatever the model would have written freely.

A model whose template has no tools section (SmolLM2, a base model) is shown the candidates as compressed
signatures in a system message and writes calls in `NEXUS_FORMAT`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from native.base import ModelError

_NAME, _KEY = "\ue010probe\ue011", "\ue012key\ue013"
_PROBE_ARGS = {_KEY: 1}


@dataclass(frozen=True)
class CallFormat:
    """opener + name + between + arguments JSON + closer is one call, `separator` stands between two calls;
    `template_tools`: the model's template renders the tools section itself (else Nexus's signature system
    message does)."""

    opener: str
    between: str
    closer: str
    template_tools: bool
    separator: str = "\n"

    def call_text(self, name: str, arguments: dict) -> str:
        return f"{self.opener}{name}{self.between}{json.dumps(arguments, ensure_ascii=False)}{self.closer}"


NEXUS_FORMAT = CallFormat('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", False)


def _probe_messages(arguments, n: int = 1) -> list[dict]:
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": _NAME, "arguments": arguments}}
             for i in range(n)]
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": calls}]


def probe_call_format(tokenizer) -> CallFormat:
    """The call format `tokenizer`'s chat template renders (NEXUS_FORMAT when it has no tools support)."""
    template = tokenizer.tool_template or tokenizer.chat_template  # the one rendered when tools are given
    if not template or "tool" not in template:
        return NEXUS_FORMAT
    tool = {"type": "function", "function": {"name": _NAME, "description": "probe", "parameters": {
        "type": "object", "properties": {_KEY: {"type": "integer"}}}}}
    try:
        head = tokenizer.apply_chat_template(_probe_messages(_PROBE_ARGS)[:1], True, tools=[tool])
    except ModelError:  # a template that fails on tools is served without them: Nexus's signatures stand in
        return NEXUS_FORMAT
    for arguments in (_PROBE_ARGS, json.dumps(_PROBE_ARGS)):  # templates differ: an object, or its JSON text
        try:
            text = tokenizer.apply_chat_template(_probe_messages(arguments), False, tools=[tool])
        except ModelError:  # the template's refusal or failure (`chat_template.render`)
            continue
        body = text[len(head):] if text.startswith(head) else ""
        if _NAME not in body or _KEY not in body:  # the tools section above holds them both: not a call
            continue
        opener, rest = body.split(_NAME, 1)
        k = rest.find("{")
        if k < 0 or _KEY not in rest[k:]:
            continue
        between = rest[:k]
        end = rest.index("}", rest.index(_KEY)) + 1
        closer = rest[end:]
        ends = [closer.find(e) for e in _TURN_ENDS if e in closer]
        closer = closer[: min(ends)] if ends else closer.rstrip()
        if opener.strip() and "\n" not in between:
            return CallFormat(opener, between, closer, True,
                              _separator(tokenizer, tool, arguments, closer, opener, len(head)))
    return NEXUS_FORMAT


def _separator(tokenizer, tool, arguments, closer: str, opener: str, start: int) -> str:
    """The text between two calls in one assistant message (after the prompt's first `start` characters; "\n"
    when the template cannot say)."""
    try:
        text = tokenizer.apply_chat_template(_probe_messages(arguments, 2), False, tools=[tool])
    except ModelError:  # the template's refusal or failure (`chat_template.render`)
        return "\n"
    first = text.find(opener, start)
    if first < 0 or (key := text.find(_KEY, first)) < 0:
        return "\n"
    end = text.find("}", key) + 1  # the first call's arguments end here (the closer may hold a "}" too)
    if not end or not text.startswith(closer, end):
        return "\n"
    second = text.find(opener, end + len(closer))
    return text[end + len(closer):second] if second >= 0 else "\n"


_TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "</s>", "<|end|>", "<|endoftext|>")
