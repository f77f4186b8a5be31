"""The agent loop: route each step of a request, decode arguments under the tool's schema, call the real MCP
tool, and answer from the observations.

One turn:
1. The request is split into steps at explicit sequencing words ("then", ";") — at most `max_steps`.
2. Each step is routed by the SLB. "none" means no tool: nothing is called for that step.
3. For a tool: a compact prompt with its compressed signature; arguments decoded under its JSON Schema by
   llguidance; `jsonschema` validation. When validation fails, or the schema is too complex for a signature
   (`fullschema.needs_full_schema`), the full schema enters the context (spliced block or text prefill) and
   the arguments are decoded again. Arguments that still fail become an `invalid_arguments` observation.
4. The call goes to the tool's MCP server (`ServerPool`); every outcome is an observation in the trace.
5. The model answers the request, streamed, with the observations in its prompt.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from native.generate import Sampler, SamplerConfig
from nexus_agent.constrained import generate_json
from nexus_agent.fullschema import insert_schema, needs_full_schema, user_tokens
from nexus_agent.memory import LiveContext, MemoryConfig, certify_answer
from nexus_agent.prompts import answer_messages, argument_messages, observation_text
from nexus_agent.servers import Observation, ServerPool
from nexus_agent.text_path import is_text_only, text_answer, text_arguments
from nexus_agent.trace import Trace
from registry.signature import compress

_STEP_SPLIT = re.compile(r"\s*(?:;\s*(?:and\s+)?(?:then\s+)?|,?\s+and then\s+"
                         r"|,?\s+then\s+|[.?!]\s+then\s+)\s*", re.IGNORECASE)


@dataclass
class AgentConfig:
    """max_steps: tool calls per turn; max_arg_tokens / max_answer_tokens: generation limits; history_turns:
    earlier turns kept in the answer prompt; n_ctx: the live context size in tokens."""

    max_steps: int = 4
    max_arg_tokens: int = 160
    max_answer_tokens: int = 96
    history_turns: int = 4
    n_ctx: int = 8192
    answer: bool = True

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.max_arg_tokens < 1 or self.max_answer_tokens < 1:
            raise ValueError("token limits must be >= 1")


@dataclass
class ToolCall:
    """One step's call: the tool, its arguments (None when none were valid), how they were produced
    (signature | full_schema), and the observation."""

    tool: str
    arguments: dict | None
    source: str
    observation: Observation
    ttfat_ms: float = 0.0


@dataclass
class TurnResult:
    request: str
    answer: str
    calls: list[ToolCall] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)


def split_steps(request: str, max_steps: int) -> list[str]:
    """The request's steps at explicit sequencing words; the tail beyond `max_steps` stays in the last step."""
    parts = [p.strip(" .") for p in _STEP_SPLIT.split(request) if p.strip(" .")]
    if len(parts) > max_steps:
        parts = parts[: max_steps - 1] + [" then ".join(parts[max_steps - 1:])]
    return parts or [request]


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


class Agent:
    """A session: backend + router + tools + servers, one live context, a trace.

    `tools`: name -> registry Tool; `router`: anything with `route(query) -> RouteDecision`;
    `on_text(kind, piece)`: streamed text ("args" or "answer"); `on_confirmed(step, tool)`: called after a
    call with valid arguments that the server answered with status ok (slb.learn records it as an example).
    """

    def __init__(self, backend, router, tools: dict, pool: ServerPool, config: AgentConfig | None = None,
                 memory: MemoryConfig | None = None, trace: Trace | None = None,
                 on_text: Callable[[str, str], None] | None = None,
                 on_confirmed: Callable[[str, str], None] | None = None):
        self.backend, self.router, self.tools, self.pool = backend, router, tools, pool
        self.config = config or AgentConfig()
        self.trace = trace or Trace()
        self.on_text = on_text or (lambda kind, piece: None)
        self.on_confirmed = on_confirmed
        self.text_only = is_text_only(backend)  # an HTTP server: text prompts, no live KV context (text_path)
        self.live = None if self.text_only else LiveContext(backend, memory, self.config.n_ctx, self.trace)
        self.history: list[dict] = []

    # -- one turn -----------------------------------------------------------------------------------------
    def run_turn(self, request: str) -> TurnResult:
        self.trace.turn += 1
        self.trace.emit("turn", request=request)
        result = TurnResult(request, "")
        observations: list[str] = []
        for step in split_steps(request, self.config.max_steps):
            d = self.router.route(step)
            route = {"step": step, "tool": d.tool, "path": d.path, "score": round(d.score, 4),
                     "margin": round(d.margin, 4), "candidates": [c[0] for c in d.candidates[:5]],
                     "route_ms": round(d.timings.get("total_ms", 0.0), 2)}
            result.routes.append(route)
            self.trace.emit("route", **route)
            if d.tool is None or d.tool not in self.tools:
                continue
            call = self.call_step(self.tools[d.tool], step)
            result.calls.append(call)
            if self.on_confirmed is not None and call.arguments is not None and call.observation.ok:
                self.on_confirmed(step, call.tool)
            observations.append(observation_text(call.tool, call.arguments or {}, call.observation.status,
                                                 call.observation.text))
        if self.config.answer:
            result.answer = self.answer(request, observations)
        self.history += [{"role": "user", "content": request}, {"role": "assistant", "content": result.answer}]
        return result

    def call_step(self, tool, step: str) -> ToolCall:
        """Arguments for `tool` from `step` (signature first, full schema when needed), then the MCP call."""
        args, problem, source, ttfat = (text_arguments(self, tool, step) if self.text_only
                                        else self._local_arguments(tool, step))
        if args is None:
            obs = Observation(tool.name, "invalid_arguments",
                              f"the model did not produce valid arguments for {tool.name}: {problem}")
        else:
            obs = self.pool.call(tool.name, args)
        self.trace.emit("tool_call", arguments=args, source=source, **obs.as_dict())
        return ToolCall(tool.name, args, source, obs, ttfat)

    def _local_arguments(self, tool, step: str) -> tuple[dict | None, str | None, str, float]:
        """(arguments, problem, source, ttfat_ms) decoded on the live KV context under the tool's schema."""
        schema = tool.input_schema or {"type": "object"}
        reason = needs_full_schema(tool)
        args, problem, source, ttfat = None, reason, "signature", 0.0
        if reason is None:
            sig = compress(tool)
            ids = self.backend.tokenizer.encode_chat(argument_messages(sig, step))
            res = self._decode_args(ids, schema)
            ttfat = res.ttft_s * 1e3
            args, problem = validate(res.text, schema) if not res.error else (None, res.error)
            self.trace.emit("args", tool=tool.name, source="signature", signature=sig, text=res.text,
                            prompt_tokens=len(ids), ttfat_ms=round(ttfat, 2), valid=args is not None,
                            problem=problem)
        if args is None:
            source = "full_schema"
            args, problem, t = self._full_schema_args(tool, step, problem)
            ttfat = ttfat or t
        return args, problem, source, ttfat

    def _decode_args(self, ids: list[int], schema: dict):
        """Prefill (reusing the cached prefix) and decode under `schema`; ttft_s counts the prefill too."""
        t0 = time.perf_counter()
        logits = self.live.prefill(ids)
        prefill_s = time.perf_counter() - t0
        res = generate_json(self.live.session, ids, schema, self.backend.tokenizer, self.config.max_arg_tokens,
                            on_token=lambda p: self.on_text("args", p), logits=logits)
        for t in res.tokens[:-1] if res.tokens else []:
            self.live.decoded(t)
        res.ttft_s += prefill_s
        return res

    def _full_schema_args(self, tool, step: str, problem: str | None):
        """The full-schema retry: splice the block when one is available, else prefill the segment as text."""
        schema = tool.input_schema or {"type": "object"}
        prefix, info = insert_schema(self.live, tool)
        ids = prefix + user_tokens(self.backend.tokenizer, step, problem)
        self.trace.emit("full_schema", tool=tool.name, why=problem, prompt_tokens=len(ids), **info)
        res = self._decode_args(ids, schema)
        args, problem2 = validate(res.text, schema) if not res.error else (None, res.error)
        self.trace.emit("args", tool=tool.name, source="full_schema", text=res.text, prompt_tokens=len(ids),
                        ttfat_ms=round(res.ttft_s * 1e3, 2), valid=args is not None, problem=problem2)
        return args, problem2, res.ttft_s * 1e3

    # -- answer -------------------------------------------------------------------------------------------
    def answer(self, request: str, observations: list[str]) -> str:
        """The model's streamed answer with this turn's observations (history trimmed to fit the budget)."""
        if self.text_only:
            return text_answer(self, request, observations)
        tok = self.backend.tokenizer
        history = self.history[-2 * self.config.history_turns:]
        ids = tok.encode_chat(answer_messages(request, observations, history))
        while history and not self.live.fits(len(ids), self.config.max_answer_tokens):
            history = history[2:]  # fallback memory policy: re-prefill without the oldest turn
            ids = tok.encode_chat(answer_messages(request, observations, history))
            self.trace.emit("memory", action="drop_oldest_turn", prompt_tokens=len(ids), budget=self.live.budget)
        t0 = time.perf_counter()
        logits = self.live.prefill(ids)
        self.live.begin_answer()
        sampler = Sampler(SamplerConfig())
        out: list[int] = []
        shown = ""
        for _ in range(self.config.max_answer_tokens):
            token = sampler(logits)
            if token in tok.eos_ids:
                break
            out.append(token)
            text = tok.decode(out)
            if not text.endswith("\ufffd"):
                self.on_text("answer", text[len(shown):])
                shown = text
            self.live.decoded(token)
            logits = self.live.session.decode(token)
        answer = tok.decode(out).strip()
        cert = certify_answer(self.live)
        if cert and cert["red_flag"] and not cert["recalled"]:
            self.live.ids = [-1]  # nothing to recall: the next prompt is re-prefilled from the transcript
            self.trace.emit("memory", action="re_prefill_next", reason="red flag and nothing recalled")
        self.trace.emit("answer", text=answer, tokens=len(out), prompt_tokens=len(ids),
                        ms=round((time.perf_counter() - t0) * 1e3, 2), cache_tokens=len(self.live.ids))
        return answer

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
        self.pool.close()
        self.trace.close()
