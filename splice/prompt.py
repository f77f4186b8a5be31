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


class LayoutError(ValueError):
    """The model's chat template renders a message differently by what stands around it (e.g. a lone system
    message as a user turn), so a segment's tokens are not the same in every conversation: nothing can be spliced
    or cached by segment with it."""


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
    return _system_message(tokenizer, schema_segment(tool))


def preamble_tokens(tokenizer, system: str = DEFAULT_SYSTEM) -> list[int]:
    """Token ids of the system prompt message that every conversation (and every block's anchor) starts with."""
    return _system_message(tokenizer, system)


def _system_message(tokenizer, text: str) -> list[int]:
    message = [{"role": "system", "content": text}]
    if text not in tokenizer.apply_chat_template(message, add_generation_prompt=False):
        # GLM-4's template keeps a system message back until the first user turn: alone, it renders nothing
        raise LayoutError("this chat template does not render a system message on its own; splicing needs it to")
    return tokenizer.encode_chat(message, add_generation_prompt=False)


def user_turn_tokens(tokenizer, text: str) -> list[int]:
    """A user message followed by the assistant generation prompt (what follows a spliced segment)."""
    msgs = [{"role": "system", "content": "x"}, {"role": "user", "content": text}]
    full = tokenizer.encode_chat(msgs, add_generation_prompt=True)
    head = tokenizer.encode_chat(msgs[:1], add_generation_prompt=False)
    if full[: len(head)] != head:
        raise LayoutError("this chat template does not render messages independently; splicing needs it to")
    return full[len(head) :]


# Generic conversation tokens a block is compiled after, one block per context. A block compiled after some
# conversation saw an attention pattern like the one deep in a real conversation, so it is closer to text
# prefill there and worse at depth 0: a splice uses the largest context not beyond its depth (`context_for`).
CONTEXTS = (0, 256)
_CONTEXT_TURNS = (
    "I am planning a trip and need to compare a few options before Friday.",
    "Of course. Tell me the cities and dates and I will look them up.",
    "Also remind me what we said about the budget spreadsheet earlier.",
    "We agreed to keep the totals in the second sheet and round to whole euros.",
)


def context_tokens(tokenizer, n: int) -> list[int]:
    """The first `n` tokens of a fixed, generic user/assistant exchange in the model's chat format (turns
    repeated as needed): what a block of context `n` is compiled after, between the system prompt and segment."""
    if n <= 0:
        return []
    msgs = [{"role": "system", "content": "x"}]
    head = tokenizer.encode_chat(msgs, add_generation_prompt=False)
    while True:
        msgs = msgs + [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(_CONTEXT_TURNS)]
        full = tokenizer.encode_chat(msgs, add_generation_prompt=False)
        if full[: len(head)] != head:
            raise LayoutError("this chat template does not render messages independently; splicing needs it to")
        if len(full) - len(head) >= n:
            return full[len(head) : len(head) + n]


def context_for(depth: int) -> int:
    """The block context a splice at `depth` tokens after the system prompt uses: the largest one <= depth."""
    return max(c for c in CONTEXTS if c <= max(depth, 0))


def tokens_hash(tokens: list[int]) -> str:
    """A short stable hash of token ids (the preamble hash in block headers)."""
    return hashlib.blake2b(json.dumps(list(map(int, tokens))).encode(), digest_size=12).hexdigest()
