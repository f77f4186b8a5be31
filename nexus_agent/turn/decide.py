"""The decision: the model sees the conversation and a few candidate tools, and calls one or answers in text.

One pass over one live context, in the call format of the model's own template (`call_format`):
1. The prompt is the conversation with the candidates in the template's tools section (or, for a model
   without one, their compressed signatures in a system message). Prefilled once; a repeated prefix (the same
   tools, an earlier turn) is reused by the live context.
2. Call or text: the model's probability of starting a call (`p_call`: the opener's first token, or a bare
   `{` / a code fence, which small models write instead) is combined with the router's evidence by the
   per-model logistic setting (`profile.DecideProfile.call_score`), with whether the request names a value
   (`request_values`: a call takes values from the request; "Bonjour, comment ça va ?" names none, "the weather
   in Paris" one); where the model is all but sure not to call (p_call below the profile's `p_veto` on every
   reading) the answer is text whatever the router says. Where the profile has a hidden-state rule
   (`DecideProfile.reading`) and the backend can read the model's final hidden state at the prompt's end (a
   session's `last_hidden`: llama.cpp, MLX), a linear reading of that state joins the score: the model's whole
   state says more about "is this a request for one of these tools" than the probability of the call token.
   `tool_choice` overrides it.
3. A call: the opener is fed, then the name: each candidate's name is scored by the model (its log-probability,
   teacher-forced) plus the router's score times the profile's `name_weight` (the fusion is calibrated per
   model), and the best one is fed; then the arguments under that tool's schema by the caller's argument
   decoder (copy-aware, on the same context), then the closer. Where parallel calls are allowed the model may
   open another call.
4. Text: the answer is decoded from the same logits with the call opener forbidden (the caller streams it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from nexus_agent.turn.call_format import CallFormat, probe_call_format
from nexus_agent.turn.profile import DecideProfile
from nexus_agent.turn.request_parts import new_part, request_values, values_left
from nexus_agent.turn.retrieval import steps_left

MAX_PARALLEL = 4


@dataclass
class Candidate:
    """A tool the router retrieved: its registry Tool, the router's score (cosine) and rank."""

    tool: object
    score: float
    rank: int

    @property
    def name(self) -> str:
        return self.tool.name


@dataclass
class Choice:
    """One call the decision makes: the tool's name; its arguments come from the caller's decoder (None and the
    `problem` in words when they missed); streamed: their pieces went to the caller as they were decoded."""

    name: str
    arguments: dict | None = None
    problem: str | None = None
    text: str = ""
    streamed: bool = False


@dataclass
class Decision:
    """kind: "call" | "text"; how: "model" | "router" | "tool_choice"; p_call: the model's probability of starting a
    call (None when it was not asked), `reading` the prompt it was read on (0: the conversation's; k: the k-th of
    `engine.readings`); score: the combined log-odds; values: whether the request names a value
    (`request_values`); calls: in order; candidates: the names shown, `scores` the router's for them,
    `top1`/`margin` its evidence; prompt_tokens; spliced: candidate blocks spliced; splice_fallback: why a block
    went in as text (the backend refused it); rechecked: what was decided again on the prompt as text (a spliced
    reading within the splice's measured reach of the other outcome); prefill_ms: the prompt into the context (both
    times where rechecked); decide_ms: prompt to decision
    (call or text, and the first name); call_ms: to the complete calls (arguments included); drafts: per call begun
    in place, the tokens drafts of copied values fed ahead and the tokens of them the decode kept."""

    kind: str
    how: str
    calls: list[Choice] = field(default_factory=list)
    p_call: float | None = None
    reading: int = 0
    score: float | None = None
    values: int = 0
    candidates: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    top1: float = 0.0
    margin: float = 0.0
    prompt_tokens: int = 0
    spliced: int = 0
    splice_fallback: str | None = None
    prefill_ms: float = 0.0
    decide_ms: float = 0.0
    call_ms: float = 0.0
    name_logprobs: dict = field(default_factory=dict)
    drafts: list = field(default_factory=list)  # per call begun in place: (tokens drafts fed ahead, kept)
    hidden_term: float | None = None  # the hidden-state rule's term (`DecideProfile.reading`), None: not used
    hidden: object = field(default=None, repr=False)  # the final hidden state it was read from (not traced)
    vetoed: bool = False  # the score said call, the model's own p(call) on every reading was below `p_veto`
    rechecked: list = field(default_factory=list)  # "call" / "name": decided again on the prompt as text, the
    # spliced prompt's reading being within the splice's reach of the other outcome (`DecideProfile.splice_err`)
    repeated: str | None = None  # the tool the model chose again on no part of the request the turn's calls of it
    # left (`made`): the decision became text

    def as_dict(self) -> dict:
        return {"kind": self.kind, "how": self.how, "calls": [c.name for c in self.calls],
                "p_call": None if self.p_call is None else round(self.p_call, 4), "reading": self.reading,
                "score": None if self.score is None else round(self.score, 3), "values": self.values,
                "hidden_term": None if self.hidden_term is None else round(self.hidden_term, 3),
                "vetoed": self.vetoed, "rechecked": self.rechecked, "repeated": self.repeated,
                "candidates": self.candidates, "scores": [round(x, 4) for x in self.scores],
                "top1": round(self.top1, 4), "margin": round(self.margin, 4),
                "prompt_tokens": self.prompt_tokens, "spliced": self.spliced, "splice_fallback": self.splice_fallback,
                "prefill_ms": round(self.prefill_ms, 1), "decide_ms": round(self.decide_ms, 1),
                "call_ms": round(self.call_ms, 1), "drafts": [list(x) for x in self.drafts]}


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def function_tool(tool) -> dict:
    """An OpenAI function tool (what chat templates' tools sections render) for a registry Tool."""
    return {"type": "function", "function": {"name": tool.name, "description": (tool.description or "").strip(),
                                             "parameters": tool.input_schema or {"type": "object"}}}


def _starts(tokenizer, fmt: CallFormat) -> tuple[np.ndarray, np.ndarray]:
    """(token ids that begin a call: the opener's first token and tokens starting `{` or a code fence; of them,
    the ones starting `{`)."""
    first = tokenizer.encode(fmt.opener, special=True)[:1]
    loose = {i: tokenizer.decode([i]).lstrip() for i in range(tokenizer.vocab_size) if i not in tokenizer.special_ids}
    loose = {i: t for i, t in loose.items() if t.startswith(("{", "```"))}
    return (np.array(sorted(set(first) | set(loose)), dtype=np.int64),
            np.array(sorted(i for i, t in loose.items() if t.startswith("{")), dtype=np.int64))


_FENCE = re.compile(r"\s*(```[A-Za-z]*\s*)?")


class Decider:
    """Decides on one `LiveContext` of `backend`; `arguments(choice_tool, live, ids, logits) -> (args, problem,
    text)` decodes one call's arguments on that context after `ids` (the caller's copy-aware decoder)."""

    def __init__(self, backend, profile: DecideProfile, fmt: CallFormat | None = None, blocks=None):
        self.backend, self.profile, self.blocks = backend, profile, blocks
        self.tok = backend.tokenizer
        self.fmt = fmt or probe_call_format(self.tok)
        self.opener = self.tok.encode(self.fmt.opener, special=True)
        self.between = self.tok.encode(self.fmt.between, special=True)
        self.closer = self.tok.encode(self.fmt.closer, special=True)
        # the token that begins another call in the same message; none where the template ends the message between
        # two calls (Llama 3.1's takes one call per message): such a model makes one call per reply
        self.next_call = [t for t in self.tok.encode(self.fmt.separator + self.fmt.opener, special=True)[:1]
                          if t not in self.tok.eos_ids]
        self.call_starts, self.brace_starts = _starts(self.tok, self.fmt)
        # control tokens no reply holds (Qwen's <|im_start|>, fill-in-the-middle markers): not the end of a turn,
        # not the call opener
        self.stray = np.array(sorted(set(self.tok.special_ids) - set(self.tok.eos_ids) - set(self.opener[:1])),
                              dtype=np.int64)
        self.all_names = False  # score every candidate's name, not only those that might win (`_name`)
        self.read_hidden = False  # read the final hidden state at every decision (the decide eval records it)

    # -- the prompt ---------------------------------------------------------------------------------------
    def prompt(self, messages: list[dict], candidates: list[Candidate]) -> tuple[list[int], list[tuple[int, int]]]:
        """(token ids, the token span of each candidate's schema, then of the template's text after them where
        there is one): the conversation with the candidates as the model's template shows tools, or, for a
        model without a tools section, as signatures (no spans). Every span is spliced from a block."""
        tools = [c.tool for c in candidates]
        if self.fmt.template_tools:
            return self.tok.encode_chat_tools(messages, tools=[function_tool(t) for t in tools], epilogue=True)
        from nexus_agent.prompts import decide_system

        system = decide_system(tools, self.fmt)
        rest = messages[1:] if messages and messages[0]["role"] == "system" else messages
        head = messages[0]["content"] + "\n\n" if messages and messages[0]["role"] == "system" else ""
        return self.tok.encode_chat([{"role": "system", "content": head + system}, *rest]), []

    def queue_blocks(self, messages: list[dict], tools: list) -> None:
        """Queue the blocks of `tools` (registry Tools) to be compiled while idle (`ToolBlocks.idle_step`), each
        after the head the conversation's system message gives, as `prompt` renders it (nothing where the
        candidates are not spliced)."""
        if self.blocks is None or not self.fmt.template_tools:
            return
        system = [m for m in messages[:1] if m["role"] == "system"]

        def render(tool) -> tuple[list[int], list[int]]:
            ids, ((a, b), *_) = self.prompt([*system, {"role": "user", "content": "?"}], [Candidate(tool, 0.0, 0)])
            return ids[:a], ids[a:b]

        self.blocks.queue(render, tools)

    def p_call(self, logits: np.ndarray) -> float:
        """p(a call begins | the reply begins with a token a reply can hold): a stray control token is no answer
        (the 0.5B Qwen put 0.73 on <|im_start|> after a Vietnamese request, then wrote a call out as text)."""
        z = logits.astype(np.float64)
        p = np.exp(z - z.max())
        valid = p.sum() - p[self.stray[self.stray < len(p)]].sum()
        return float(p[self.call_starts].sum() / valid) if valid > 0 else 0.0

    # -- one decision -------------------------------------------------------------------------------------
    def decide(self, live, ids: list[int], candidates: list[Candidate], top1: float, margin: float,
               arguments: Callable, tool_choice: str | None = "auto", parallel: bool = False,
               spans: list[tuple[int, int]] = (), request: str = "", made: Sequence[Choice] = (),
               beside: Callable[[], Iterable[list[int]]] | None = None, steps: Sequence[list[str]] = ()) -> tuple:
        """Decide on `live` after the prompt `ids` (`self.prompt(messages, candidates)`, with the candidates'
        `spans` spliced from their blocks when the decider has `blocks`; `request`: the user's words, whose
        values weigh for a call (`request_values`) and which parallel calls divide among themselves; `made`: the
        turn's calls so far): (Decision, the ids the context holds, the logits after them). For a text decision
        the logits are the prompt's, ready for the answer (with `text_mask` first among its processors). A tool
        the turn has called already is called again only on a part of the request its calls in `made` did not
        take (`new_part`: "and in London" after Paris); when the first call would not be, the decision is text.
        Shown any tool's result, Qwen2.5-Coder-0.5B reads p_call 0.99 and calls it again: the same git log, a
        `create_table` whose query is the first call's "Table created successfully", a `convert_time` of the
        time it was just given. `beside()`: prompts of the same candidates for conversations beside this one
        (`engine.readings`: the last exchange alone, the conversation without its prose); where this prompt's
        reading decides text and the backend can read theirs beside it (`p_call_beside`), p_call is the largest
        (`reading`: which one, 0 for this prompt's) and one that decides a call ends the reading. `steps`: for a
        request in steps, each step's first candidates (`retrieval.Retrieved.steps`): a further call chooses
        among those of the steps no call took yet (`retrieval.steps_left`), where any is shown (after the time
        step's call the 0.5B Qwen weighed `git_status` 0.03 nats above `git_log` for "then show the last 2
        commits of the repository at ...", a tool the step's retrieval ranks below its first three)."""
        t0 = time.perf_counter()
        prompt = ids
        approx = False  # the context holds blocks spliced with a repair: near what the prompt as text computes
        if self.blocks is not None and spans and live.manager is None:
            logits, st = self.blocks.prefill(live, ids, spans, epilogue=len(spans) > len(candidates))
            spliced, refused, approx = st.spliced, st.refused, st.spliced > st.exact
        else:
            logits, spliced, refused = live.prefill(ids), 0, None
        d = Decision("text", "model", candidates=[c.name for c in candidates], scores=[c.score for c in candidates],
                     top1=top1, margin=margin, prompt_tokens=len(ids), spliced=spliced, splice_fallback=refused,
                     prefill_ms=(time.perf_counter() - t0) * 1e3)

        def as_text(upto: list[int]):
            """The prompt again from its first spliced block on, prefilled as text, then `upto` (which extends the
            prompt): for a spliced decision within the splice's reach of going the other way."""
            nonlocal approx
            t1 = time.perf_counter()
            a = spans[0][0]
            live.session.remove(a, live.session.n_past)
            live.ids = live.ids[:a]
            out = live.prefill(upto)
            approx = False
            d.prefill_ms += (time.perf_counter() - t1) * 1e3
            return out

        named = tool_choice not in (None, "auto", "none", "required")
        if tool_choice == "none" or not candidates:
            d.how = "tool_choice" if tool_choice == "none" else "model"
        elif tool_choice == "required" or named:
            d.kind, d.how = "call", "tool_choice"
        else:
            unread = self._call_or_text(d, live, ids, logits, request, beside)
            if approx and self.profile.splice_may_flip(d.p_call, top1, margin, d.values, unread, d.hidden_term):
                d.rechecked.append("call")
                logits = as_text(ids)
                self._call_or_text(d, live, ids, logits, request, beside)
        if d.kind == "text":
            d.decide_ms = (time.perf_counter() - t0) * 1e3
            return d, ids, logits
        pool = [c for c in candidates if c.name == tool_choice] if named else candidates
        done = ids  # through the last call made: a further call that is not made leaves nothing in the ids
        while True:
            ids = ids + self.opener
            logits = live.prefill(ids)
            left = {n for s in steps_left(steps, [m.name for m in d.calls]) for n in s} if d.calls else set()
            shown = [c for c in pool if c.name in left] or pool
            name, lps, near = self._name(live, ids, logits, shown, self.profile.splice_name_err if approx else 0.0)
            if near:  # a spliced choice within the splice's reach of another name: chosen on the prompt as text
                d.rechecked.append("name")
                logits = as_text(ids)
                name, lps, _ = self._name(live, ids, logits, shown)
            ids = ids + self.tok.encode(name) + self.between
            logits = live.prefill(ids)
            if not d.calls:
                d.decide_ms = (time.perf_counter() - t0) * 1e3
                d.name_logprobs = lps
            tool = next(c.tool for c in pool if c.name == name)
            args, problem, text = arguments(tool, live, ids, logits)
            again = [c for c in made if c.name == name]
            if again and d.how == "model" and not new_part(args, again, request):
                if d.calls:
                    break
                d.kind, d.repeated, logits = "text", name, live.prefill(prompt)  # the context holds the prompt again
                d.decide_ms = (time.perf_counter() - t0) * 1e3
                return d, prompt, logits
            if d.calls and not new_part(args, d.calls, request):
                break  # a further call must act on a part of the request no earlier call took (small models
                # otherwise repeat a call, or call every candidate with the same value)
            d.calls.append(Choice(name, args, problem, text))
            ids = done = self._after_arguments(live, ids, text) + self.closer
            if (not parallel or not self.next_call or len(d.calls) >= MAX_PARALLEL or named
                    or not values_left(request, d.calls)):
                break  # (no value of the request is left for a further call: `new_part` would drop it, decoded)
            logits = live.prefill(ids)
            p = np.exp(logits.astype(np.float64) - logits.max())
            if p[self.next_call].sum() / p.sum() < 0.5:  # the model would rather end its message
                break
            ids = ids + self.tok.encode(self.fmt.separator, special=True)
        d.call_ms = (time.perf_counter() - t0) * 1e3
        return d, done, None

    def _call_or_text(self, d: Decision, live, ids: list[int], logits, request: str,
                      beside: Callable[[], Iterable[list[int]]] | None) -> bool:
        """Call or text on the prompt's `logits` (`decide`), into `d`; whether a reading beside was unread (the
        model's "no" is then not known to hold: no veto)."""
        prof = self.profile
        d.p_call, d.values, d.reading = self.p_call(logits), request_values(request), 0
        d.hidden = self.last_hidden(live) if prof.reading or self.read_hidden else None
        h = d.hidden_term = prof.hidden_term(d.hidden)
        unread = False
        calls = prof.calls(d.p_call, d.top1, d.margin, d.values, hidden=h)
        for k, alt in enumerate(beside() if beside is not None and not calls else (), 1):
            p = self.p_call_beside(live, ids, alt)
            if p is None:
                unread = True
                continue
            if p > d.p_call:
                d.p_call, d.reading = p, k
            if prof.calls(d.p_call, d.top1, d.margin, d.values, hidden=h):
                break
        d.score = prof.call_score(d.p_call, d.top1, d.margin, d.values, h)
        d.kind = "call" if prof.calls(d.p_call, d.top1, d.margin, d.values, unread, h) else "text"
        d.vetoed = d.score > 0 and d.kind == "text"
        return unread

    @staticmethod
    def last_hidden(live):
        """The model's final hidden state at the end of `live`'s context (a session's `last_hidden`: llama.cpp,
        MLX), None where the backend cannot read it or the context evicts."""
        from native.base import BackendError

        read = getattr(live.session, "last_hidden", None)
        if read is None or live.manager is not None:
            return None
        try:
            return read()
        except BackendError:
            return None

    def p_call_beside(self, live, ids: list[int], alt: list[int]) -> float | None:
        """p_call after `alt`, read on the backend's scratch sequence from the prefix it shares with `ids` (which
        `live` holds): None where the backend cannot (no `probe`, an evicting context, no room)."""
        from native.base import BackendError

        n = next((i for i, (a, b) in enumerate(zip(ids, alt)) if a != b), min(len(ids), len(alt)))
        probe = getattr(live.session, "probe", None)
        if probe is None or live.manager is not None or n >= len(alt) or live.ids[:n] != ids[:n]:
            return None
        try:
            return self.p_call(probe(n, alt[n:]))
        except BackendError:
            return None

    def _after_arguments(self, live, ids: list[int], text: str) -> list[int]:
        """`ids` and the arguments `text`: the tokens the context holds after `ids` where they spell the start of
        `text` (decoded in place), then the rest of it encoded. Encoding the whole text again gives other tokens
        for some values (a path, a number), which made the next prefill compute the arguments again and left
        the context's ids naming tokens it does not hold."""
        held = live.ids[len(ids):] if live.ids[:len(ids)] == ids else []
        spelled = self.tok.decode(held)
        if not text.startswith(spelled):  # the arguments came from elsewhere (the fallback's own prompt)
            held, spelled = [], ""
        return ids + held + self.tok.encode(text[len(spelled):])

    def name_logprobs(self, live, ids: list[int], logits, names: list[str], offsets: dict | None = None,
                      reach: float = 0.0) -> dict[str, float]:
        """log p(name, then the text after a name | `ids`) for candidate names, teacher-forced on `live` (which
        holds `ids`, `logits` after them) and removed again: every name, or, given `offsets` (name -> what the
        choice adds to its log-probability), only the names that might still win. A name's log-probability is at
        most its first token's, which the logits give for free; names are scored best bound first and the rest
        skipped once no bound comes within `reach` of the best total: the same choice (and every name within
        `reach` of it), usually after one or two passes instead of one per candidate."""
        base = live.session.n_past
        first = _log_softmax(logits)
        seqs = {n: self.tok.encode(n) + self.between[:1] for n in names}
        extra = offsets or dict.fromkeys(names, 0.0)
        bound = {n: float(first[seqs[n][0]]) + extra[n] for n in names}
        out, best = {}, -np.inf
        for n in sorted(names, key=lambda n: -bound[n]):
            if offsets is not None and bound[n] < best - reach:
                break
            seq = seqs[n]
            lp = float(first[seq[0]])
            if len(seq) > 1:
                rows = _log_softmax(live.session.forward_logits(seq[:-1]))
                lp += float(sum(rows[j, t] for j, t in enumerate(seq[1:])))
                live.session.remove(base, live.session.n_past)
            out[n] = lp
            best = max(best, lp + extra[n])
        return out

    def _name(self, live, ids: list[int], logits, pool: list[Candidate], reach: float = 0.0):
        """Choose one candidate after the opener by `DecideProfile.name_score` (the model's log-probability of
        the name, the router's score, the offset of its rank); (name, the log-probabilities scored, whether
        another name scored within `reach` of it: a spliced prompt's choice the prompt as text might not make).
        `all_names`: score every name (the decide eval fits the profile on them), not only those that might win."""
        offsets = {c.name: self.profile.name_score(0.0, c.score, c.rank) for c in pool}
        lps = {pool[0].name: 0.0} if len(pool) == 1 else self.name_logprobs(
            live, ids, logits, [c.name for c in pool], None if self.all_names else offsets, reach)
        totals = sorted(((lps[c.name] + offsets[c.name], c.name) for c in pool if c.name in lps),
                        key=lambda t: -t[0])  # stable: the first listed of equal totals first
        near = reach > 0 and len(totals) > 1 and totals[0][0] - totals[1][0] <= reach
        return totals[0][1], lps, near

    def text_mask(self) -> Callable:
        """A logits processor that keeps a text decision text: the call opener's first token is forbidden, and so
        is a JSON object where the answer begins (bare or in a code fence): the 0.5B Qwen writes a call out as
        `{"name": ...}` text, which a framework would show as the answer; a stray control token (`stray`) is
        forbidden throughout (it wrote `<|im_start|>` and then a call)."""
        first = self.opener[:1]
        brace, stray = self.brace_starts, self.stray

        def mask(tokens, logits):
            logits = logits.copy()
            logits[stray[stray < len(logits)]] = -np.inf
            if len(tokens) <= 8 and _FENCE.fullmatch(self.tok.decode(tokens) if tokens else ""):
                logits[brace[brace < len(logits)]] = -np.inf
                if not tokens and first:
                    logits[first] = -np.inf
            return logits
        return mask


def decider_for(backend) -> Decider:
    """The backend's Decider: its model's call format and decide profile, with candidate blocks where the
    profile splices and the backend can (kept in the Nexus home's `blocks/<fingerprint>/<backend>/tools`)."""
    from nexus_agent.turn.blocks import ToolBlocks
    from nexus_agent.turn.profile import load_decide_profile
    from registry.home import nexus_home

    fmt = probe_call_format(backend.tokenizer)
    profile = load_decide_profile(backend.info.fingerprint, fmt.template_tools)
    blocks = None
    if profile.splice and backend.capabilities.can_splice:
        blocks = ToolBlocks(backend, folder=nexus_home() / "blocks" / backend.info.fingerprint / backend.name / "tools")
    return Decider(backend, profile, fmt, blocks)


def top_k(decision, tools: dict, profile: DecideProfile, registry_size: int) -> list[Candidate]:
    """The candidates shown to the model. When the registry fits (`fit_all`), every tool in registry order: the
    tools section is then the same on every turn and its tokens stay cached. Else the router's first `k` (`k_sure`
    when its gate is sure), its pick first (the fused order may differ from the scan's). A candidate's score is
    its own for the last user message where `decision` has them (`retrieval.Retrieved.own`; below the lowest of
    them for a tool only the conversation brought in)."""
    scores = {c[0]: c[1] for c in decision.candidates}
    own = getattr(decision, "own", None)
    if own:
        floor = min(own.values())
        scores = {**{n: min(floor, s) for n, s in scores.items()}, **own}
    if registry_size <= profile.fit_all:
        return [Candidate(t, scores.get(n, 0.0), i) for i, (n, t) in enumerate(tools.items())]
    names = [c[0] for c in decision.candidates]
    if decision.tool is not None and decision.tool in names:
        names.remove(decision.tool)
        names.insert(0, decision.tool)
    shown = names[: profile.shown(decision.path)]
    return [Candidate(tools[n], scores[n], i) for i, n in enumerate(shown) if n in tools]
