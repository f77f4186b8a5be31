"""One call's arguments from its own prompt, and the policy for a call the model misses.

`ArgumentDecoder.decode(tool, step, results, sources) -> ArgumentsResult`. One attempt (`_attempt`) is the
backend's: constrained decoding with the copy bias on a live KV context here, `text_path.TextArgumentDecoder`
on a text-only server. `make_decoder` picks by the backend's capability.

The policy when arguments do not validate is here, in one place, for `nexus run`, `nexus serve` and the turn
engine (`turn.engine.decide_turn` calls `decode` when a decision's in-place arguments fail):
1. the compressed signature prompt (skipped when the schema is too complex for one: `fullschema.needs_full_schema`);
2. a larger budget: a document still open at `max_arg_tokens` is not cut there; the same decode goes on to
   `EXTEND` times that budget with the loop guard's closers preferred (`constrained.generate_json(extend_to=)`),
   so a runaway array or string ends as complete JSON and nothing decoded is thrown away;
3. the full schema in the context (a spliced block, or text) and a decode again, when nothing was streamed;
4. a miss: `ArgumentsResult.missing` names the value that is missing or wrong, and `miss_answer` is the text a
   server answers with instead of a call (never an error: a model's miss is not the server breaking).

Streaming (`on_piece`) is honest: pieces go out as they are decoded only when nothing streamed can be taken
back, i.e. when the grammar enforces the whole schema (`constrained.grammar_enforces`: a finished document is
then valid by construction, and step 2 continues the same decode instead of restarting it). Other schemas are
decoded silently and sent once valid. The one case where streamed arguments stay incomplete is a document the
model leaves open even after the larger budget (or the client's `max_tokens`): the caller then ends the reply
with `finish_reason: "length"`, as OpenAI ends a call cut by the token limit, and says what is missing.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Callable

from nexus_agent.arguments.constrained import generate_json, grammar_enforces
from nexus_agent.arguments.copy_sources import Source
from nexus_agent.arguments.drafts import copy_processors
from nexus_agent.arguments.fullschema import full_schema_prompt, needs_full_schema
from nexus_agent.prompts import argument_messages
from registry.signature import compress

EXTEND = 4  # the larger budget, in multiples of max_arg_tokens


@dataclass
class ArgumentsResult:
    """arguments: valid under the schema, or None; problem: why not; source: signature | full_schema (the
    attempt that produced them); ttfat_ms: to the first argument token; text: the last attempt's JSON;
    prompt_tokens / completion_tokens: summed over the attempts; cut: the last attempt ended at the token
    limit with its JSON open; streamed: its pieces went to `on_piece` as they were decoded; missing: for a
    miss, which value is missing or wrong, in words (`describe_miss`)."""

    arguments: dict | None
    problem: str | None
    source: str
    ttfat_ms: float
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cut: bool = False
    streamed: bool = False
    missing: str = ""


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


def budgets(max_arg_tokens: int, limit: int | None = None) -> tuple[int, int]:
    """(the budget an attempt wraps up in, the larger budget it may go on to): `max_arg_tokens` and `EXTEND`
    times it, both within `limit` (a client's max_tokens)."""
    cap = limit if limit else EXTEND * max_arg_tokens
    return max(1, min(max_arg_tokens, cap)), max(1, min(EXTEND * max_arg_tokens, cap))


def _names(keys: list[str]) -> str:
    quoted = [f"'{k}'" for k in keys]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def describe_miss(text: str, schema: dict, problem: str | None, cut: bool = False) -> str:
    """Which value a failed call lacks, in words: "the value of 'b' is missing", "the value of 'code' is not
    valid (...)". `text`: the arguments decoded (possibly cut); `cut`: they ended at the token limit."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        cls = jsonschema.validators.validator_for(schema)
        for e in sorted(cls(schema).iter_errors(value), key=lambda e: list(e.path)):
            at = "/".join(str(p) for p in e.path)
            if e.validator == "required":
                lacking = [f"{at}/{k}" if at else k for k in e.validator_value
                           if isinstance(e.instance, dict) and k not in e.instance]
                if lacking:
                    verb = "is" if len(lacking) == 1 else "are"
                    return f"the value{'s' if len(lacking) > 1 else ''} of {_names(lacking)} {verb} missing"
            return f"the value of '{at or '(arguments)'}' is not valid ({e.message[:120]})"
        return f"the arguments are not valid ({problem})" if problem else "the arguments are not valid"
    required = [k for k in schema.get("required", []) if isinstance(k, str)]
    written = re.findall(r'"((?:[^"\\]|\\.)*)":', text)
    lacking = ([written[-1]] if cut and written else []) + [k for k in required if k not in written]
    lacking = list(dict.fromkeys(lacking))
    why = "the arguments were cut at the token limit" if cut else (problem or "no valid JSON")
    if not lacking:
        return f"the arguments are incomplete ({why})"
    verb = "is" if len(lacking) == 1 else "are"
    return f"the value{'s' if len(lacking) > 1 else ''} of {_names(lacking)} {verb} missing ({why})"


def miss_answer(misses: list[tuple[str, str]]) -> str:
    """The text answer for calls whose arguments missed: `misses` are (tool name, `ArgumentsResult.missing`)."""
    return " ".join(f"I could not fill in the arguments of {name}: {what}." for name, what in misses)


class ArgumentDecoder:
    """Arguments on `live` (a LiveContext) of `backend`; `config` has max_arg_tokens, copy_bias and
    copy_rank (AgentConfig); `trace` gets an "args" event per attempt; `on_text("args", piece)` streams."""

    def __init__(self, backend, live, config, trace, on_text: Callable[[str, str], None]):
        self.backend, self.live, self.config, self.trace, self.on_text = backend, live, config, trace, on_text

    def decode(self, tool, step: str, results: list[str], sources: list[Source],
               on_piece: Callable[[str], None] | None = None, limit: int | None = None) -> ArgumentsResult:
        """The call's arguments by the module's policy (signature, larger budget, full schema, a named miss).
        `on_piece(text)` gets the JSON as it is decoded when nothing streamed can be taken back (the grammar
        enforces the whole schema); `limit`: at most this many tokens per attempt (a client's max_tokens)."""
        schema = tool.input_schema or {"type": "object"}
        reason = needs_full_schema(tool)
        out = ArgumentsResult(None, reason, "signature" if reason is None else "full_schema", 0.0)
        live = on_piece is not None and grammar_enforces(schema)
        shown: list[str] = []

        def piece(p: str) -> None:
            self.on_text("args", p)
            if live:
                shown.append(p)
                on_piece(p)

        budget, larger = budgets(self.config.max_arg_tokens, limit)
        if reason is None:
            self._try(out, tool, step, results, sources, None, budget, larger, piece)
        if out.arguments is None and not shown:  # the full schema: nothing streamed has to be taken back
            out.source = "full_schema"
            self._try(out, tool, step, results, sources, out.problem or "", budget, larger, piece)
        out.streamed = bool(shown)
        if out.arguments is None:
            out.missing = describe_miss(out.text, schema, out.problem, out.cut)
        return out

    def _try(self, out: ArgumentsResult, tool, step, results, sources, problem, budget, larger, piece) -> None:
        """One attempt into `out` (its text, validity and counts; times and tokens add up), traced."""
        schema = tool.input_schema or {"type": "object"}
        text, ms, n_prompt, error, n_out, cut = self._attempt(tool, step, results, sources, problem, budget,
                                                              larger, piece)
        out.text, out.ttfat_ms, out.cut = text, out.ttfat_ms or ms, cut
        out.prompt_tokens += n_prompt
        out.completion_tokens += n_out
        out.arguments, out.problem = validate(text, schema) if not error else (None, error)
        if cut:
            out.problem = f"cut at the token limit after {n_out} tokens ({out.problem})"
        extra = {"signature": compress(tool)} if problem is None else {}
        self.trace.emit("args", tool=tool.name, source="signature" if problem is None else "full_schema", **extra,
                        text=text, prompt_tokens=n_prompt, ttfat_ms=round(ms, 2), tokens=n_out,
                        extended=n_out > budget, valid=out.arguments is not None, problem=out.problem)

    def _attempt(self, tool, step: str, results: list[str], sources: list[Source], problem: str | None,
                 budget: int | None = None, larger: int | None = None, piece: Callable[[str], None] | None = None):
        """(text, ms to the first token, prompt tokens, error, tokens generated, cut) of one constrained decode
        on the live context: the signature prompt when `problem` is None, else the full-schema segment (spliced
        or prefilled); wrapped up in `budget` tokens, going on to `larger` if its JSON is still open."""
        schema = tool.input_schema or {"type": "object"}
        tok = self.backend.tokenizer
        live = self.live
        t0 = time.perf_counter()
        if problem is None:
            ids = tok.encode_chat(argument_messages(compress(tool), step, results))
        else:
            ids, info = full_schema_prompt(live, tool, step, problem or None, results)
            self.trace.emit("full_schema", tool=tool.name, why=problem, prompt_tokens=len(ids), **info)
        logits = live.prefill(ids)
        prefill_s = time.perf_counter() - t0
        session = live.session if self.config.copy_rank else None
        procs = copy_processors(tok, sources, schema, self.config.copy_bias, session, self.config.drafts)
        res = generate_json(live.session, ids, schema, tok, budget or self.config.max_arg_tokens,
                            on_token=piece or (lambda p: self.on_text("args", p)), logits=logits, processors=procs,
                            extend_to=larger)
        for t in res.tokens[: res.decoded]:
            live.decoded(t)
        return res.text, (res.ttft_s + prefill_s) * 1e3, len(ids), res.error, len(res.tokens), res.cut

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
