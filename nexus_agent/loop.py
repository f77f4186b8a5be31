"""The agent loop: route each step of a request, decode arguments under the tool's schema, call the real MCP
tool, and answer from the observations.

One turn:
1. The request is split into steps at explicit sequencing words ("then", ";") — at most `max_steps`.
2. Each step is routed by the SLB. "none" means no tool: nothing is called for that step.
3. For a tool: a compact prompt with its compressed signature (and the turn's earlier results); arguments
   decoded under its JSON Schema by llguidance, with a bias toward values copied from the step or an
   earlier result (`copying.CopyBias`); `jsonschema` validation. When validation fails, or the schema is too
   complex for a signature (`fullschema.needs_full_schema`), the full schema enters the context (spliced
   block or text prefill) and the arguments are decoded again. Arguments that still fail become an
   `invalid_arguments` observation.
4. The call goes to the tool's MCP server (`ServerPool`); every outcome is an observation in the trace.
5. The model answers the request, streamed, with the observations in its prompt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from native.generate import stream_generate
from nexus_agent.arguments.copy_sources import Source, value_sources
from nexus_agent.arguments.copying import DEFAULT_BIAS
from nexus_agent.arguments.decoder import ArgumentsResult, make_decoder
from nexus_agent.memory import LiveContext, MemoryConfig, certify_answer
from nexus_agent.prompts import answer_messages, observation_text
from nexus_agent.servers import Observation, ServerPool
from nexus_agent.trace import Trace
from nexus_agent.turn.decide import decider_for
from nexus_agent.turn.retrieval import split_steps


@dataclass
class AgentConfig:
    """max_steps: tool calls per turn; max_arg_tokens / max_answer_tokens: generation limits; history_turns:
    earlier turns kept in the answer prompt; n_ctx: the live context size in tokens; copy_bias: the logit bias
    toward copied argument values (`nexus_agent.arguments.copying`)."""

    max_steps: int = 4
    max_arg_tokens: int = 160
    max_answer_tokens: int = 96
    history_turns: int = 4
    n_ctx: int = 8192
    answer: bool = True
    copy_bias: float = DEFAULT_BIAS  # 0 turns copy-aware decoding off (schema-constrained decoding only)
    copy_rank: bool = True  # rank whole candidate copies by the model's likelihood (CopyBias with a session)
    drafts: bool = True  # feed drafts of the request's next values ahead, verified (`arguments.drafts`)

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.max_arg_tokens < 1 or self.max_answer_tokens < 1:
            raise ValueError("token limits must be >= 1")


@dataclass
class ToolCall:
    """One step's call: the tool, its arguments (None when none were valid), how they were produced
    (signature | full_schema), the observation, and where each argument value came from
    (`copy_sources.value_sources`: request | observation | enum | default | generated)."""

    tool: str
    arguments: dict | None
    source: str
    observation: Observation
    ttfat_ms: float = 0.0
    value_sources: dict = field(default_factory=dict)


@dataclass
class TurnResult:
    request: str
    answer: str
    calls: list[ToolCall] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)


def result_text(call: ToolCall, limit: int = 300) -> str:
    """An earlier call's result as a later step sees it (prompt and copy source): the result only, not the
    call's own arguments, which a small model would otherwise copy again."""
    text = call.observation.text if len(call.observation.text) <= limit else call.observation.text[:limit] + " …"
    return f"{call.tool} returned: {text}" if call.observation.ok else f"{call.tool} failed: {text}"


def _call_messages(calls: list[ToolCall], first: int) -> list[dict]:
    """An assistant message with `calls` and one tool message per result, OpenAI-style."""
    import json

    ids = [f"call_{first + i}" for i in range(len(calls))]
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": c.tool, "arguments": json.dumps(c.arguments or {})}}
        for i, c in zip(ids, calls)]}
    return [msg] + [{"role": "tool", "tool_call_id": i, "name": c.tool, "content": c.observation.text}
                    for i, c in zip(ids, calls)]


class Agent:
    """A session: backend + router + tools + servers, one live context, a trace.

    `tools`: name -> registry Tool; `router`: anything with `route(query) -> RouteDecision`;
    `on_text(kind, piece)`: streamed text ("args" or "answer"); `on_confirmed(step, tool)`: called after a
    call with valid arguments that the server answered with status ok and no failure in its words
    (`Observation.confirmed`; slb.learn records it as an example).
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
        self.decoder = make_decoder(backend, lambda: LiveContext(backend, memory, self.config.n_ctx, self.trace),
                                    self.config, self.trace, lambda kind, piece: self.on_text(kind, piece))
        self.live = self.decoder.live  # None on a text-only server (arguments.text_path): no KV context
        self.history: list[dict] = []
        self.decider = None if self.live is None else decider_for(backend)

    # -- one turn -----------------------------------------------------------------------------------------
    def run_turn(self, request: str) -> TurnResult:
        self.trace.turn += 1
        self.trace.emit("turn", request=request)
        if self.decider is not None and self.decider.profile.mode == "model" and self.router is not None:
            return self._decided_turn(request)
        result = TurnResult(request, "")
        observations: list[str] = []
        prof = self.decider.profile if self.decider is not None else None
        for step in split_steps(request, self.config.max_steps):
            d = self.router.route(step)
            route = {"step": step, "tool": d.tool, "path": d.path, "score": round(d.score, 4),
                     "margin": round(d.margin, 4), "candidates": [c[0] for c in d.candidates[:5]],
                     "route_ms": round(d.timings.get("total_ms", 0.0), 2)}
            if d.tool is not None and prof is not None and not prof.router_calls(d.score, step):
                route.update(tool=None, path="none", no_value=True)  # names no value, below the profile's floor
            result.routes.append(route)
            self.trace.emit("route", **route)
            if route["tool"] is None or d.tool not in self.tools:
                continue
            call = self.call_step(self.tools[d.tool], step, [result_text(c) for c in result.calls])
            result.calls.append(call)
            if self.on_confirmed is not None and call.arguments is not None and call.observation.confirmed:
                self.on_confirmed(step, call.tool)
            observations.append(observation_text(call.tool, call.arguments or {}, call.observation.status,
                                                 call.observation.text))
        if self.config.answer:
            result.answer = self.answer(request, observations)
        self.history += [{"role": "user", "content": request}, {"role": "assistant", "content": result.answer}]
        return result

    def _decided_turn(self, request: str) -> TurnResult:
        """The model decides among the router's candidates (`nexus_agent.turn.engine.decide_turn`), the chosen
        tools are called, and it decides again with their results, until it answers in text (at most
        `max_steps` rounds of calls; then an answer is asked for with tool_choice none)."""
        from nexus_agent.turn.engine import decide_turn

        result = TurnResult(request, "")
        messages = [*self.history[-2 * self.config.history_turns:], {"role": "user", "content": request}]
        for round_ in range(self.config.max_steps + 1):
            choice = "auto" if round_ < self.config.max_steps else "none"
            turn = decide_turn(self.decider, self.router, self.tools, messages, lambda ids: self.live,
                               self.config.n_ctx, self.arguments, choice, True, self.config.max_arg_tokens)
            d = turn.decision
            self.trace.emit("decide", profile=self.decider.profile.source, **d.as_dict())
            result.routes.append({"step": request, "tool": d.calls[0].name if d.calls else None, "path": d.how,
                                  "candidates": d.candidates[:5], "decide_ms": round(d.decide_ms, 1)})
            if d.kind == "text":
                if self.config.answer:
                    result.answer = self._stream_answer(turn)
                break
            calls = []
            for c in d.calls:
                sources = [Source("request", request)]
                if c.arguments is None:
                    obs = Observation(c.name, "invalid_arguments",
                                      f"the model did not produce valid arguments for {c.name}: {c.problem}")
                else:
                    obs = self.pool.call(c.name, c.arguments)
                provenance = value_sources(c.arguments, sources, self.tools[c.name].input_schema or {})
                self.trace.emit("tool_call", arguments=c.arguments, source="decision", value_sources=provenance,
                                **obs.as_dict())
                call = ToolCall(c.name, c.arguments, "decision", obs, d.decide_ms, provenance)
                result.calls.append(call)
                calls.append(call)
                if self.on_confirmed is not None and c.arguments is not None and obs.confirmed:
                    self.on_confirmed(request, c.name)
            messages += _call_messages(calls, len(result.calls) - len(calls))
        self.history += [{"role": "user", "content": request}, {"role": "assistant", "content": result.answer}]
        return result

    def _stream_answer(self, turn) -> str:
        """The text answer decoded from a text decision's logits on its live context (streamed to on_text)."""
        tok = self.backend.tokenizer
        live = turn.live
        live.begin_answer()
        out: list[int] = []
        t0 = time.perf_counter()
        for r in stream_generate(self.backend, turn.ids, self.config.max_answer_tokens, session=live.session,
                                 logits=turn.logits, logits_processors=[self.decider.text_mask()]):
            if r.finish_reason == "stop":
                break
            out.append(r.token)
            if r.finish_reason is None:
                live.decoded(r.token)
            if r.text:
                self.on_text("answer", r.text)
        answer = tok.decode(out).strip()
        self.trace.emit("answer", text=answer, tokens=len(out), prompt_tokens=len(turn.ids),
                        ms=round((time.perf_counter() - t0) * 1e3, 2), cache_tokens=len(live.ids))
        return answer

    def call_step(self, tool, step: str, results: list[str] | None = None) -> ToolCall:
        """Arguments for `tool` from `step` and the turn's earlier `results` (signature first, full schema when
        needed; values may be copied from both), then the MCP call."""
        results = list(results or [])
        sources = [Source("request", step)] + [Source("observation", r) for r in results]
        res = self.arguments(tool, step, results, sources)
        args, problem, source, ttfat = res.arguments, res.problem, res.source, res.ttfat_ms
        if args is None:
            obs = Observation(tool.name, "invalid_arguments",
                              f"the model did not produce valid arguments for {tool.name}: {res.missing or problem}")
        else:
            obs = self.pool.call(tool.name, args)
        provenance = value_sources(args, sources, tool.input_schema or {})
        self.trace.emit("tool_call", arguments=args, source=source, value_sources=provenance, **obs.as_dict())
        return ToolCall(tool.name, args, source, obs, ttfat, provenance)

    def arguments(self, tool, step: str, results: list[str], sources: list[Source],
                  limit: int | None = None) -> ArgumentsResult:
        """Arguments by `arguments.decoder`'s policy: the compressed signature first, a larger budget for JSON
        still open, the full schema (a spliced block, or text) when they failed validation, a named miss."""
        return self.decoder.decode(tool, step, results, sources, limit=limit)

    # -- answer -------------------------------------------------------------------------------------------
    def answer(self, request: str, observations: list[str]) -> str:
        """The model's streamed answer with this turn's observations: on the live context, or from a text-only
        server (the decoder knows which)."""
        return self.decoder.answer(self, request, observations)

    def answer_local(self, request: str, observations: list[str]) -> str:
        """The answer on the live context (history trimmed to fit the budget)."""
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
        out: list[int] = []
        for r in stream_generate(self.backend, ids, self.config.max_answer_tokens, session=self.live.session,
                                 logits=logits):
            if r.finish_reason == "stop":
                break
            out.append(r.token)
            if r.finish_reason is None:  # the session decoded this token (a length-capped last one it did not)
                self.live.decoded(r.token)
            if r.text:
                self.on_text("answer", r.text)
        answer = tok.decode(out).strip()
        cert = certify_answer(self.live)
        if cert and cert["red_flag"] and not cert["recalled"]:
            self.live.ids = [-1]  # nothing to recall: the next prompt is re-prefilled from the transcript
            self.trace.emit("memory", action="re_prefill_next", reason="red flag and nothing recalled")
        self.trace.emit("answer", text=answer, tokens=len(out), prompt_tokens=len(ids),
                        ms=round((time.perf_counter() - t0) * 1e3, 2), cache_tokens=len(self.live.ids))
        return answer

    def close(self) -> None:
        if self.decider is not None and self.decider.blocks is not None:  # the blocks this session compiled
            self.decider.blocks.close()
        self.decoder.close()
        self.pool.close()
        self.trace.close()
