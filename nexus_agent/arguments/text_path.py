"""The agent's path on a text-only backend (`capabilities.text_only`: an OpenAI-compatible HTTP server).

There is no local KV cache, so nothing is spliced, evicted or prefix-reused here: every prompt goes to the server
as chat messages. The argument prompts are the same as on a local backend (the compressed signature first; the
full schema *as text* when the signature is not enough or its arguments failed). The server constrains the
reply with the tool's (closed) JSON Schema through `response_format`; `jsonschema` validates every reply
regardless, since servers differ in how much of JSON Schema they enforce.
"""

from __future__ import annotations

import time

from native.generate import SamplerConfig
from nexus_agent.arguments.constrained import closed_schema
from nexus_agent.arguments.decoder import ArgumentDecoder
from nexus_agent.prompts import answer_messages, argument_messages, full_schema_messages, render_schema
from registry.signature import compress


def _stream(agent, messages: list[dict], max_tokens: int, kind: str, schema: dict | None = None):
    """(text, ttft_s, prompt_tokens, pieces) of one streamed server reply; pieces stream to agent.on_text."""
    t0 = time.perf_counter()
    text, ttft, prompt_tokens, n = "", None, 0, 0
    for r in agent.backend.stream_text(messages, max_tokens, SamplerConfig(), schema=schema):
        ttft = r.ttft_s if ttft is None else ttft
        prompt_tokens, n = r.prompt_tokens or prompt_tokens, r.generation_tokens
        if r.text:
            text += r.text
            agent.on_text(kind, r.text)
    return text, (ttft if ttft is not None else time.perf_counter() - t0), prompt_tokens, n


class TextArgumentDecoder(ArgumentDecoder):
    """Argument decoding on a text-only server (`ArgumentDecoder.decode` runs the same signature-then-full-schema
    flow). The server constrains its reply with the tool's closed schema through `response_format`; values
    cannot be copy-biased here (no logits), `jsonschema` validates every reply."""

    def _attempt(self, tool, step: str, results: list[str], sources, problem: str | None, budget: int | None = None,
                 larger: int | None = None, piece=None):
        """(text, ms to the first piece, prompt tokens, error, tokens generated, cut): the signature prompt when
        `problem` is None, else the full schema as text; up to `larger` tokens (a server cannot be asked to wrap
        up at `budget`). Pieces stream through `on_text` only: nothing is shown before it validates."""
        if problem is None:
            messages = argument_messages(compress(tool), step, results)
        else:
            self.trace.emit("full_schema", tool=tool.name, why=problem, how="text_prefill",
                            fallback="text-only backend: the server holds no splice blocks")
            messages = full_schema_messages(render_schema(tool), step, problem or None, results)
        schema = closed_schema(tool.input_schema or {"type": "object"})
        limit = larger or self.config.max_arg_tokens
        text, ttft, n_prompt, n = _stream(self, messages, limit, "args", schema)
        return text, ttft * 1e3, n_prompt, None, n, n >= limit

    def answer(self, agent, request: str, observations: list[str]) -> str:
        """The turn's streamed answer from the server (history: the last `history_turns` turns)."""
        t0 = time.perf_counter()
        history = agent.history[-2 * agent.config.history_turns:]
        text, _, n_prompt, n = _stream(agent, answer_messages(request, observations, history),
                                       agent.config.max_answer_tokens, "answer")
        answer = text.strip()
        agent.trace.emit("answer", text=answer, tokens=n, prompt_tokens=n_prompt,
                         ms=round((time.perf_counter() - t0) * 1e3, 2), cache_tokens=0)
        return answer
