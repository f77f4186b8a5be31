"""One call's arguments from its own prompt: the compressed signature first, the full schema when needed.

`ArgumentDecoder.decode(tool, step, results, sources) -> ArgumentsResult`. The signature prompt is tried first
unless the schema is too complex for a signature (`fullschema.needs_full_schema`); when its arguments fail
validation the full schema enters the context (a spliced block, or text) and they are decoded again. One
attempt (`_attempt`) is the backend's: constrained decoding with the copy bias on a live KV context here,
`text_path.TextArgumentDecoder` on a text-only server. `make_decoder` picks by the backend's capability.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from nexus_agent.arguments.constrained import generate_json
from nexus_agent.arguments.copy_sources import Source
from nexus_agent.arguments.copying import CopyBias
from nexus_agent.arguments.fullschema import insert_schema, needs_full_schema, user_tokens
from nexus_agent.prompts import argument_messages
from registry.signature import compress


@dataclass
class ArgumentsResult:
    """arguments: valid under the schema, or None; problem: why not; source: signature | full_schema (the
    attempt that produced them); ttfat_ms: to the first argument token; text: the last attempt's JSON;
    prompt_tokens / completion_tokens: summed over the attempts."""

    arguments: dict | None
    problem: str | None
    source: str
    ttfat_ms: float
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0


def validate(arguments_text: str, schema: dict) -> tuple[dict | None, str | None]:
    """(arguments, None) when the text is a JSON object valid under `schema`; else (None, the problem)."""
    import json

    import jsonschema

    try:
        value = json.loads(arguments_text)
    except ValueError as e:
        return None, f"not valid JSON ({e.msg} at character {e.pos}): {arguments_text[:80]!r}"
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema).iter_errors(value), key=lambda e: list(e.path))
    if errors:
        where = "/".join(str(p) for p in errors[0].path) or "(root)"
        return None, f"arguments fail the schema at {where}: {errors[0].message}"
    if not isinstance(value, dict):
        return None, "arguments must be a JSON object"
    return value, None


class ArgumentDecoder:
    """Arguments on `live` (a LiveContext) of `backend`; `config` has max_arg_tokens, copy_bias and
    copy_rank (AgentConfig); `trace` gets an "args" event per attempt; `on_text("args", piece)` streams."""

    def __init__(self, backend, live, config, trace, on_text: Callable[[str, str], None]):
        self.backend, self.live, self.config, self.trace, self.on_text = backend, live, config, trace, on_text

    def decode(self, tool, step: str, results: list[str], sources: list[Source]) -> ArgumentsResult:
        schema = tool.input_schema or {"type": "object"}
        reason = needs_full_schema(tool)
        out = ArgumentsResult(None, reason, "signature", 0.0)
        if reason is None:
            text, ms, n_prompt, error, n_out = self._attempt(tool, step, results, sources, None)
            out.ttfat_ms, out.text = ms, text
            out.prompt_tokens, out.completion_tokens = n_prompt, n_out
            out.arguments, out.problem = validate(text, schema) if not error else (None, error)
            self.trace.emit("args", tool=tool.name, source="signature", signature=compress(tool), text=text,
                            prompt_tokens=n_prompt, ttfat_ms=round(ms, 2), valid=out.arguments is not None,
                            problem=out.problem)
        if out.arguments is None:
            out.source = "full_schema"
            text, ms, n_prompt, error, n_out = self._attempt(tool, step, results, sources, out.problem or "")
            out.text, out.ttfat_ms = text, out.ttfat_ms or ms
            out.prompt_tokens += n_prompt
            out.completion_tokens += n_out
            out.arguments, out.problem = validate(text, schema) if not error else (None, error)
            self.trace.emit("args", tool=tool.name, source="full_schema", text=text, prompt_tokens=n_prompt,
                            ttfat_ms=round(ms, 2), valid=out.arguments is not None, problem=out.problem)
        return out

    def _attempt(self, tool, step: str, results: list[str], sources: list[Source], problem: str | None):
        """(text, ms to the first token, prompt tokens, error, tokens generated) of one constrained decode on
        the live context: the signature prompt when `problem` is None, else the full-schema segment (spliced or
        prefilled)."""
        schema = tool.input_schema or {"type": "object"}
        tok = self.backend.tokenizer
        live = self.live
        t0 = time.perf_counter()
        if problem is None:
            ids = tok.encode_chat(argument_messages(compress(tool), step, results))
        else:
            prefix, info = insert_schema(live, tool)
            ids = prefix + user_tokens(tok, step, problem or None, results)
            self.trace.emit("full_schema", tool=tool.name, why=problem, prompt_tokens=len(ids), **info)
        logits = live.prefill(ids)
        prefill_s = time.perf_counter() - t0
        session = live.session if self.config.copy_rank else None
        copy = [CopyBias(tok, sources, schema, self.config.copy_bias, session)] if self.config.copy_bias else []
        res = generate_json(live.session, ids, schema, tok, self.config.max_arg_tokens,
                            on_token=lambda p: self.on_text("args", p), logits=logits, processors=copy)
        for t in res.tokens[: res.decoded]:
            live.decoded(t)
        return res.text, (res.ttft_s + prefill_s) * 1e3, len(ids), res.error, len(res.tokens)

    def answer(self, agent, request: str, observations: list[str]) -> str:
        """The turn's answer: on the live context (`Agent.answer_local`)."""
        return agent.answer_local(request, observations)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()


def make_decoder(backend, live_factory: Callable[[], object], config, trace, on_text) -> ArgumentDecoder:
    """The decoder the backend can run: on a live KV context, or through a text-only server's API."""
    if backend.capabilities.text_only:
        from nexus_agent.arguments.text_path import TextArgumentDecoder

        return TextArgumentDecoder(backend, None, config, trace, on_text)
    return ArgumentDecoder(backend, live_factory(), config, trace, on_text)
