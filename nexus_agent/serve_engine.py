"""The model side of `nexus serve`: one backend, the SLB embedder, and the agent's own argument path, driven by
one OpenAI chat request at a time (the HTTP layer, `nexus_agent.server`, serialises requests onto one worker
thread; nothing here is thread-safe on purpose).

A request's `tools` are what Nexus routes over. Each tool's embedding is kept by its schema hash in memory and
in the Nexus home's embedding store (`slb.embed_store`, shared with `nexus mcp` and the registry, so a restart
embeds nothing it has seen; one stderr line per new tool list says how many were embedded), and the Router over
a tool list is cached by the list's hashes, so a repeated tool list costs neither an embedding nor an index
build. The last user message is split into steps (`turn.retrieval.split_steps`) and each step
routed (`slb.router.Router`, gate mode: "none" means no call; `tool_choice: "required"` takes the scan's top-1
anyway; a named function skips routing). Arguments come from `arguments.decoder.ArgumentDecoder` (compressed
signature prompt, llguidance schema grammar, copy bias from the request and earlier tool results, its policy for
a miss: a larger budget, the full schema, then a text answer naming the missing value, never an error). On a
streamed request argument pieces are emitted as they are decoded where the decoder says nothing streamed can be
taken back (`_decide`, `_tool_calls`); other calls are emitted once valid (`_finish_calls`). A reply
without a tool call (`tool_choice: "none"`, no tool routed, or every step answered by a tool result) is a
normal answer: `stream_generate` over the conversation rendered with the chat template, optionally under a
`GrammarMask` for `response_format`. Live contexts are reused by longest common token prefix: one for
argument prompts (they share their system prompt), `contexts` for conversations.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from nexus_agent.openai_api import ApiError, ChatRequest, StopText, new_id, render_messages, result_text, tool_names
from nexus_agent.openai_api import usage as usage_of
from nexus_agent.turn.retrieval import MAX_STEPS, split_steps

DEFAULT_MAX_TOKENS = 512  # answer tokens when the request sets no limit (capped by the context left)


class Cancelled(Exception):
    """The client went away: generation stops at the next token."""


@dataclass
class EngineConfig:
    """backend/model: as `nexus generate` (None: the packaged SmolLM2); n_ctx: tokens per live context;
    kv_budget: the conversation contexts' KV budget (eviction, `nexus_agent.memory`); contexts: conversation
    contexts kept for prefix reuse; embed_cache / router_cache: LRU sizes (tools, tool lists); compile_idle: compile
    the schema blocks of a new tool list between requests (`idle_step`)."""

    backend: str = "llamacpp"
    model: str | None = None
    n_ctx: int = 8192
    kv_budget: int | None = None
    contexts: int = 2
    max_arg_tokens: int = 160
    embed_cache: int = 8192
    router_cache: int = 8
    compile_idle: bool = True
    chat_template: str | None = None  # a Jinja file's path or text rendered instead of the model's own

    def __post_init__(self):
        if self.contexts < 1:
            raise ValueError(f"contexts must be >= 1, got {self.contexts}")
        if self.n_ctx < 256:
            raise ValueError(f"n_ctx must be >= 256 tokens, got {self.n_ctx}")


def model_name(model: str | None) -> str:
    """The id /v1/models lists: the packaged name, or the file / folder name without extension."""
    import os

    if model is None:
        return "smollm2"
    base = os.path.basename(os.path.normpath(model))
    return base[:-5] if base.endswith(".gguf") else base


class Engine:
    """Loads the model and the embedder once; `run(request, emit, cancelled)` answers one request.

    `emit(event)` receives, in order: ("start",) once the request is accepted (errors come before it, as
    ApiError), then ("content", text) pieces or ("tool_call", index, id, name) / ("arguments", index, text),
    and last ("finish", finish_reason, usage dict).
    """

    def __init__(self, config: EngineConfig | None = None):
        from native import load_backend
        from nexus_agent.arguments.decoder import ArgumentDecoder
        from nexus_agent.loop import AgentConfig
        from nexus_agent.memory import LiveContext
        from nexus_agent.trace import Trace
        from nexus_agent.turn.decide import decider_for
        from slb.embed_store import EmbeddingStore
        from slb.embedder import Embedder, EmbedderConfig, batch_threads

        self.config = c = config or EngineConfig()
        self.backend = load_backend(c.backend, c.model, chat_template=c.chat_template)
        if self.backend.capabilities.text_only:
            raise ValueError("nexus serve needs a local backend (llamacpp or mlx), not a text-only server")
        self.tok = self.backend.tokenizer
        self.model_id = model_name(c.model)
        self.embedder = Embedder(EmbedderConfig(memory_cache=c.embed_cache, threads=batch_threads()),
                                 EmbeddingStore()).load()
        self.routers: OrderedDict[str, object] = OrderedDict()  # digest of a tool list's hashes -> Router
        self._cancelled: Callable[[], bool] = lambda: False
        self.trace = Trace()
        # arguments from their own prompt (router-only plans, and the fallback of a decision's in-place ones)
        self.decoder = ArgumentDecoder(self.backend, LiveContext(self.backend, None, c.n_ctx, self.trace),
                                       AgentConfig(n_ctx=c.n_ctx, max_arg_tokens=c.max_arg_tokens), self.trace,
                                       self._on_text)
        self.contexts: list = []
        self.decider = decider_for(self.backend)  # the model's call format and decide profile (nexus_agent.turn)
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile the Numba scan and build llguidance's tokenizer and the copy index now (seconds), not on the
        first request: one routing and one argument decode of a one-parameter tool."""
        from native.base import ModelError, TemplateRefusal
        from nexus_agent.arguments.copy_sources import Source
        from registry.model import Tool

        tool = Tool.from_mcp(_WARMUP)
        self.router_for([tool]).route("warm up")
        try:
            self.decoder.decode(tool, "Say hi", [], [Source("request", "Say hi")])
        except TemplateRefusal as e:  # it would fail every request: say so at start, with the way out
            raise ModelError(f"this model's chat template fails on a plain conversation ({e}); start with "
                             "--chat-template FILE (a template that works for this model)") from None
        self.trace.events.clear()

    # -- tools and routing ------------------------------------------------------------------------------------
    def router_for(self, tools: list, messages: list[dict] | None = None):
        """A gate-mode Router over `tools` (cached per tool list; embeddings cached per schema hash). With the
        request's `messages`, a new list that the decision shows a few at a time has its tools' blocks queued
        to compile while idle (`idle_step`), after the head those messages give."""
        from slb.buffer import quantize_rows
        from slb.index import ScanIndex
        from slb.router import Router
        from slb.tools import as_entry, strip_server_prefixes

        entries = strip_server_prefixes([as_entry(t) for t in tools])  # routing texts without framework prefixes
        key = hashlib.sha256("\n".join(e.schema_hash for e in entries).encode()).hexdigest()
        if key in self.routers:
            self.routers.move_to_end(key)
            return self.routers[key]
        t0 = time.perf_counter()
        vectors = self.embedder.embed_tools(entries)  # memory, then the home's embedding store, then the model
        m8, scales = quantize_rows(vectors)
        router = Router(self.embedder, ScanIndex(m8, scales), entries, mode="gate")
        router.route(entries[0].name)
        print(f"nexus serve: tool list of {self.embedder.last.line()}; routable in {time.perf_counter() - t0:.2f} s",
              file=sys.stderr, flush=True)
        self.routers[key] = router
        if len(self.routers) > self.config.router_cache:
            self.routers.popitem(last=False)
        if self.config.compile_idle and messages is not None and len(tools) > self.decider.profile.fit_all:
            from nexus_agent.openai_api import template_messages

            self.decider.queue_blocks(template_messages(messages), tools)
        return router

    def plan(self, req: ChatRequest) -> list[tuple[object, str]]:
        """The (tool, step) calls this reply makes; [] for a text answer."""
        if not req.tools or req.tool_choice == "none":
            return []
        last = max((i for i, m in enumerate(req.messages) if m["role"] == "user"), default=None)
        if last is None:
            return []
        text = req.messages[last]["content"]
        done = sum(1 for m in req.messages[last + 1:] if m["role"] == "tool")
        by_name = {t.name: t for t in req.tools}
        if req.named:
            return [] if done else [(by_name[req.tool_choice], text)]
        steps = split_steps(text, MAX_STEPS)
        pending = steps[done:] if req.parallel_tool_calls else steps[done:done + 1]
        if not pending and req.tool_choice == "required":
            pending = [text]
        router = self.router_for(req.tools)
        prof = self.decider.profile
        calls = []
        for step in pending:
            d = router.route(step)
            tool = d.tool if prof.router_calls(d.score, step) else None
            name = tool or (d.candidates[0][0] if req.tool_choice == "required" else None)
            if name is not None:
                calls.append((by_name[name], step))
        return calls

    # -- one request ------------------------------------------------------------------------------------------
    def run(self, req: ChatRequest, emit: Callable[[tuple], None], cancelled: Callable[[], bool]) -> None:
        if (far := [i for i in req.logit_bias if i >= self.tok.vocab_size]):  # before any work on the request
            raise ApiError(400, f"logit_bias: token id {far[0]} is not in this model's vocabulary (ids 0 to "
                                f"{self.tok.vocab_size - 1})", "invalid_request_error", "logit_bias")
        self.trace.events.clear()
        self._cancelled = cancelled
        try:
            if req.tools and req.tool_choice != "none" and self.decider.profile.mode == "model":
                self._decide(req, emit, cancelled)
                return
            calls = self.plan(req)
            if calls:
                self._tool_calls(req, calls, emit)
            else:
                self._answer(req, emit, cancelled)
        except Cancelled:
            return

    def decide(self, req: ChatRequest, arguments: Callable | None = None, on_arguments: Callable | None = None):
        """The turn engine's decision for `req` (`nexus_agent.turn.engine.decide_turn`): a `Turn`.
        `arguments` replaces the argument decoding (evals that measure the decision only); `on_arguments` is
        decide_turn's sink for argument pieces as they are decoded."""
        from nexus_agent.turn.engine import PromptTooLong, decide_turn

        tool_choice = req.tool_choice if req.named or req.tool_choice == "required" else "auto"
        try:
            return decide_turn(self.decider, self.router_for(req.tools, req.messages), {t.name: t for t in req.tools},
                               req.messages, self._context, self.config.n_ctx, self.decoder.decode, tool_choice,
                               req.parallel_tool_calls, self.config.max_arg_tokens, arguments, on_arguments,
                               req.max_tokens)
        except PromptTooLong as e:
            raise ApiError(400, str(e), "invalid_request_error", "messages", "context_length_exceeded") from None

    def _decide(self, req: ChatRequest, emit, cancelled) -> None:
        """Tool calls as the model decided (the first streamed as its arguments are decoded, where nothing
        streamed can be taken back), or its answer decoded from the same context; a miss is a text answer."""
        shown: dict[int, str] = {}  # call index -> id, for calls whose pieces went out as they were decoded

        def on_arguments(index: int, tool, live: bool):
            def show(piece: str) -> bool:
                if cancelled():
                    raise Cancelled()
                if not (live and req.stream):
                    return False
                if index not in shown:
                    shown[index] = new_id("call_")
                    emit(("start",))
                    emit(("tool_call", index, shown[index], tool.name))
                emit(("arguments", index, piece))
                return True
            return show

        turn = self.decide(req, on_arguments=on_arguments)
        decision, ids = turn.decision, turn.ids
        self.trace.emit("decide", profile=self.decider.profile.source, **decision.as_dict())
        if decision.kind == "text":
            self._answer(req, emit, cancelled, prompt=(ids, turn.logits, turn.live), first=[self.decider.text_mask()])
            return
        if not shown:
            emit(("start",))
        calls = [(c.name, c.arguments, c.text, c.streamed, c.problem) for c in decision.calls]
        self._finish_calls(calls, emit, len(ids), 0)

    def _finish_calls(self, calls: list[tuple], emit, n_prompt: int, n_out: int) -> None:
        """Send the calls not streamed yet and the finish. `calls`: (name, arguments or None, the text decoded, whether
        that text was streamed already, the miss in words); a call not streamed is sent as its decoded text
        where that holds its arguments, so that the next request shows the model the tokens its context holds.
        Calls that missed are left out; with none left the reply is the text answer naming the missing value
        (`arguments.decoder.miss_answer`), with finish_reason "length" when a streamed call's arguments were
        left open (the client holds them cut, as OpenAI sends a cut call)."""
        from nexus_agent.arguments.decoder import miss_answer

        index, misses, open_call = 0, [], False
        for name, arguments, decoded, streamed, problem in calls:
            if streamed:
                n_out += len(self.tok.encode(decoded))
                index += 1
                if arguments is None:
                    misses.append((name, problem))
                    open_call = True
                continue
            if arguments is None:
                misses.append((name, problem))
                continue
            emit(("tool_call", index, new_id("call_"), name))
            text = decoded if _holds(decoded, arguments) else json.dumps(arguments, ensure_ascii=False)
            ids = self.tok.encode(text)
            n_out += len(ids)
            for piece in _pieces(self.tok, ids):
                emit(("arguments", index, piece))
            index += 1
        if misses and (open_call or index == 0):
            emit(("content", miss_answer(misses)))
        finish = "length" if open_call else ("tool_calls" if index else "stop")
        emit(("finish", finish, usage_of(n_prompt, n_out)))

    def _on_text(self, kind: str, piece: str) -> None:
        if self._cancelled():  # raised inside the decode loop; the next prefill drops what it left cached
            raise Cancelled()

    def _tool_calls(self, req: ChatRequest, calls: list, emit) -> None:
        """The routed calls' arguments by the decoder's policy (`arguments.decoder`); on a streamed request each
        call's pieces go out as they are decoded where nothing streamed can be taken back, else once valid."""
        from nexus_agent.arguments.copy_sources import Source

        names = tool_names(req.messages)
        results = [result_text(m, names) for m in req.messages if m["role"] == "tool"][-4:]
        emit(("start",))
        n_prompt, done = 0, []
        for tool, step in calls:
            index, head = sum(d[2] is not None or d[1] is not None for d in done), []

            def on_piece(piece: str, index=index, head=head, name=tool.name) -> None:
                if not head:
                    head.append(new_id("call_"))
                    emit(("tool_call", index, head[0], name))
                emit(("arguments", index, piece))

            sources = [Source("request", step)] + [Source("observation", r) for r in results]
            res = self.decoder.decode(tool, step, results, sources, on_piece if req.stream else None, req.max_tokens)
            n_prompt += res.prompt_tokens
            done.append((tool.name, res.arguments, res.text, res.streamed, res.missing))
        self._finish_calls(done, emit, n_prompt, 0)

    def _context(self, ids: list[int]):
        """The conversation context sharing the longest token prefix with `ids`; a new one instead, while fewer
        than `contexts` exist, when reusing it would drop more cached tokens than it saves (another
        conversation's turns). The next request of the same conversation shares all but the reply's last
        tokens, so it reuses its context: a new one would prefill the tools prompt again (18 s for 10 tools on
        the 0.5B Qwen, one core)."""
        from nexus_agent.memory import LiveContext, MemoryConfig

        def common(live) -> int:
            n = 0
            for a, b in zip(live.ids, ids):
                if a != b:
                    break
                n += 1
            return n

        best = max(self.contexts, key=common, default=None)
        if best is None or (len(best.ids) - common(best) > common(best) and len(self.contexts) < self.config.contexts):
            best = LiveContext(self.backend, MemoryConfig(self.config.kv_budget), self.config.n_ctx)
        else:
            self.contexts.remove(best)
        self.contexts.append(best)
        return best

    def _answer(self, req: ChatRequest, emit, cancelled, prompt=None, first=()) -> None:
        """Stream the text answer; `prompt`: (ids, logits after them, the live context holding them) when the
        decision already prefilled it; `first`: logits processors before the response format's."""
        from native.generate import SamplerConfig, penalties, stream_generate
        from nexus_agent.arguments.constrained import GrammarMask, LoopGuard, schema_grammar

        ids = prompt[0] if prompt else self.tok.encode_chat(render_messages(req.messages))
        room = self.config.n_ctx - len(ids)
        max_new = req.max_tokens or min(DEFAULT_MAX_TOKENS, room)
        if room < 1 or len(ids) + max_new > self.config.n_ctx:
            raise ApiError(400, f"this model's context holds {self.config.n_ctx} tokens; the messages take "
                                f"{len(ids)} and max_tokens asks for {max_new} more", "invalid_request_error",
                           "messages", "context_length_exceeded")
        procs = list(first)
        if req.presence_penalty or req.frequency_penalty or req.logit_bias:
            procs.insert(0, penalties(req.presence_penalty, req.frequency_penalty, req.logit_bias))
        if req.json_schema is not None:
            grammar = GrammarMask(self.tok, schema_grammar(req.json_schema))
            if grammar.error:
                raise ApiError(400, f"response_format schema not supported: {grammar.error}",
                               param="response_format")
            procs += [grammar, LoopGuard(self.tok)]
        emit(("start",))
        if prompt:
            live, logits = prompt[2], prompt[1]
        else:
            live = self._context(ids)
            logits = live.prefill(ids)
        live.begin_answer()
        stop, out, finish = StopText(req.stop), [], None
        sampler = SamplerConfig(req.temperature, req.top_p, req.seed if req.seed is not None else 0)
        try:
            for r in stream_generate(self.backend, ids, max_new, sampler, session=live.session,
                                     logits_processors=procs, logits=logits):
                if cancelled():
                    return
                if r.finish_reason == "stop":
                    finish = "stop"
                    break
                out.append(r.token)
                shown = stop.feed(r.text)
                if shown:
                    emit(("content", shown))
                if stop.hit:
                    finish = "stop"
                    break
                finish = r.finish_reason
            if not stop.hit and (rest := stop.flush()):
                emit(("content", rest))
        finally:  # the cache holds the prompt and the tokens the session decoded (never the last yielded one)
            live.ids = (ids + out)[: live.session.n_past]
        emit(("finish", finish or "stop", usage_of(len(ids), len(out))))

    def idle_step(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """One unit of work while no request waits (one tool's prefill at most, given up when `stop()` turns
        true): the candidates' blocks of a new tool list compiled and written to the Nexus home. Whether more
        remains."""
        blocks = self.decider.blocks
        return blocks is not None and blocks.pending > 0 and blocks.idle_step(stop)

    def stats(self) -> dict:
        b = self.decider.blocks
        blocks = {"held": len(b.blocks), "pending": b.pending, "compiled": b.compiled, "saved": b.saved,
                  "loaded": b.loaded} if b is not None else None
        return {"contexts": len(self.contexts), "context_tokens": [len(c.ids) for c in self.contexts],
                "embedding_cache": self.embedder.memory_vectors, "router_cache": len(self.routers),
                "tools_embedded": self.embedder.tools_embedded, "tools_from_store": self.embedder.tools_from_store,
                "blocks": blocks}

    def close(self) -> None:
        if self.decider.blocks is not None:  # blocks compiled by the last requests outlive the process
            self.decider.blocks.close()
        for live in self.contexts:
            live.close()
        self.decoder.close()
        self.backend.close()


def _holds(text: str | None, arguments) -> bool:
    """Whether `text` is JSON for exactly `arguments`, with no space around it."""
    try:
        return bool(text) and text.strip() == text and json.loads(text) == arguments
    except ValueError:
        return False


def _pieces(tok, ids: list[int]):
    """The text of `ids` in the model's own token pieces (a multi-byte character kept whole)."""
    from native.generate import Detokenizer

    text = Detokenizer(tok)
    for t in ids:
        if piece := text.add(t):
            yield piece


_WARMUP = {"name": "warm_up", "description": "say a word",
           "inputSchema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}

