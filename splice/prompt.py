"""The prompt format of a tool-schema segment: one function renders it for the compiler and for the agent.

A conversation is laid out as `preamble` (the system prompt, as its own chat message), then history, and a
tool's full schema enters as its own chat segment (a system message) wherever the agent needs it. A block is
compiled from exactly the tokens `segment_tokens` returns, so the spliced cache and a text prefill of the
same segment see identical token ids.
"""

from __future__ import annotations

import hashlib
import json

from registry.model import Tool

DEFAULT_SYSTEM = (
    "You are Nexus, a local agent that calls MCP tools. When a tool fits the request, answer with one JSON "
    'object {"name": ..., "arguments": {...}} that follows the tool\'s input schema exactly.'
)


def schema_segment(tool: Tool) -> str:
    """The text of a tool's schema segment (the message content, without chat markup)."""
    schema = json.dumps(tool.input_schema, sort_keys=True, separators=(", ", ": "), ensure_ascii=False)
    lines = [f"Tool: {tool.name}"]
    if tool.title:
        lines.append(f"Title: {tool.title}")
    if tool.description:
        lines.append(f"Description: {tool.description}")
    lines.append(f"Input schema: {schema}")
    return "\n".join(lines)


def segment_tokens(tokenizer, tool: Tool) -> list[int]:
    """Token ids of the schema segment as its own chat message (markup included), ready to splice or prefill."""
    return tokenizer.encode_chat([{"role": "system", "content": schema_segment(tool)}], add_generation_prompt=False)


def preamble_tokens(tokenizer, system: str = DEFAULT_SYSTEM) -> list[int]:
    """Token ids of the system prompt message that every conversation (and every block's anchor) starts with."""
    return tokenizer.encode_chat([{"role": "system", "content": system}], add_generation_prompt=False)


def user_turn_tokens(tokenizer, text: str) -> list[int]:
    """A user message followed by the assistant generation prompt (what follows a spliced segment)."""
    msgs = [{"role": "system", "content": "x"}, {"role": "user", "content": text}]
    full = tokenizer.encode_chat(msgs, add_generation_prompt=True)
    head = tokenizer.encode_chat(msgs[:1], add_generation_prompt=False)
    if full[: len(head)] != head:
        raise ValueError("this chat template does not render messages independently; splicing needs it to")
    return full[len(head) :]


def tokens_hash(tokens: list[int]) -> str:
    """A short stable hash of token ids (the preamble hash in block headers)."""
    return hashlib.blake2b(json.dumps(list(map(int, tokens))).encode(), digest_size=12).hexdigest()
