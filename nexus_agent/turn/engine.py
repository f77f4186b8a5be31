"""One turn's decision, shared by `nexus run` (the agent loop), `nexus serve` and `nexus mcp`'s agent path:
retrieve the candidates for the conversation, let the model decide among them, decode the arguments.

`decide_turn` is the whole of it; callers differ only in what they do with the `Decision`: the agent loop
calls the tools and decides again with their results, the server returns the calls to its client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from native.base import TemplateRefusal
from nexus_agent.arguments.constrained import grammar_enforces, token_bytes
from nexus_agent.arguments.copy_sources import Source
from nexus_agent.arguments.decoder import budgets, describe_miss
from nexus_agent.arguments.in_place import decode_in_place
from nexus_agent.turn.decide import Candidate, Choice, Decider, Decision, top_k
from nexus_agent.turn.retrieval import retrieve


class PromptTooLong(ValueError):
    """The conversation and the candidates shown do not fit the context."""


@dataclass
class Turn:
    """A decided turn: the Decision, the prompt ids, the logits after them (a text decision's answer starts
    there: after tool results, on `prompts.results_answer_messages`; where the model would have called, p(call)
    >= 0.5, on the plain conversation without the tools section) and the live context that holds them."""

    decision: Decision
    ids: list[int]
    logits: object
    live: object


def tool_results(messages: list[dict], limit: int = 4) -> list[str]:
    """The last `limit` tool results of the conversation, as copy sources and prompts see them."""
    from nexus_agent.openai_api import result_text, tool_names

    names = tool_names(messages)
    return [result_text(m, names) for m in messages if m["role"] == "tool"][-limit:]


def last_user(messages: list[dict]) -> str:
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


def without_prose(messages: list[dict]) -> list[dict]:
    """`messages` without the assistant's text answers before the last user message (calls and results kept), or
    `messages` itself when it has none. After a text answer in its history the 0.5B Qwen answers every later
    request in text (p(call) 0.003 for "What time is it in Paris now?", 0.97 when the history ends at a tool
    result), and its call-or-text rule was fitted on requests without history: p(call) is also read there."""
    start = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    prose = {i for i, m in enumerate(messages[:start]) if m["role"] == "assistant" and not m.get("tool_calls")
             and (m.get("content") or "").strip()}
    return [m for i, m in enumerate(messages) if i not in prose] if prose else messages


def last_exchange(messages: list[dict]) -> list[dict]:
    """The leading system messages and the conversation from its last user message on, or `messages` itself when
    nothing comes between them: the single request the call-or-text rule was fitted on. Four calls and their
    results into a conversation, the 0.5B Qwen reads p(call) 0.05 for a request it calls alone at 0.96 (a
    Vietnamese Uber booking, `nexus eval serve`'s conversation)."""
    head = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    start = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    return messages[:head] + messages[start:] if start > head else messages


def readings(messages: list[dict]) -> list[list[dict]]:
    """The conversations beside `messages` whose p(call) is also read, cheapest first (each shares the system
    prompt and the tools with it): the last exchange alone, then the conversation without its prose."""
    out: list[list[dict]] = []
    for alt in (last_exchange(messages), without_prose(messages)):
        if alt is not messages and alt not in out:
            out.append(alt)
    return out


def decision_prompt(decider: Decider, messages: list[dict], cands: list[Candidate]) -> tuple[list[int], list]:
    """The prompt the decision is read on (`Decider.prompt`: its ids and the candidates' spans), over the
    conversation as the model's template takes it (`as_template_takes`)."""
    return decider.prompt(as_template_takes(decider.fmt, messages), cands)


def as_template_takes(fmt, messages: list[dict]) -> list[dict]:
    """The conversation as a template with call format `fmt` takes it: a tools section's convention (calls and
    results as such), else plain turns (`render_messages`)."""
    from nexus_agent.openai_api import render_messages, template_messages

    return template_messages(messages) if fmt.template_tools else render_messages(messages)


def respelled(held: list[int], ids: list[int], tb, start: int = 0, window: int = 64) -> list[int]:
    """`ids` with each stretch after `start` that spells the same bytes as the tokens `held` has there replaced
    by those tokens (`tb`: the bytes of each token). A context holds the model's own tokens for the calls it
    decoded (`{"` then `company`); the next request's prompt encodes the same text into other tokens (` {"`,
    `company":"`), and every token from the first that differs would be computed again. Stops where the bytes
    differ or no common boundary comes within `window` tokens."""
    out, i, j = list(ids[:start]), start, start
    while i < len(held) and j < len(ids):
        if held[i] == ids[j]:
            out.append(ids[j])
            i, j = i + 1, j + 1
            continue
        a, b, ha, hb = i, j, b"", b""
        while a - i < window and b - j < window:
            if len(ha) <= len(hb) and a < len(held):
                ha += tb[held[a]]
                a += 1
            elif b < len(ids):
                hb += tb[ids[b]]
                b += 1
            else:
                break
            n = min(len(ha), len(hb))
            if ha[:n] != hb[:n]:
                return out + list(ids[j:])
            if ha == hb:
                break
        if ha != hb or not ha:
            return out + list(ids[j:])
        out += held[i:a]
        i, j = a, b
    return out + list(ids[j:])


def reading_prompts(decider: Decider, messages: list[dict], cands: list[Candidate]):
    """The prompts of `readings(messages)` with the candidates `cands` shown, as `decision_prompt` builds them; a
    reading the model's template refuses in every shape (`chat_template.render`) is not read."""
    for alt in readings(messages):
        try:
            yield decision_prompt(decider, alt, cands)[0]
        except TemplateRefusal:
            continue


def calls_made(messages: list[dict]) -> list[Choice]:
    """The calls the assistant made since the last user message (the current turn's), with their arguments (an
    argument text that is no JSON object reads as `{}`)."""
    start = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    out = []
    for m in messages[start + 1:]:
        for c in m.get("tool_calls") or ():
            try:
                args = json.loads(c["function"].get("arguments") or "{}")
            except ValueError:
                args = None
            out.append(Choice(c["function"]["name"], args if isinstance(args, dict) else {}))
    return out


def decide_turn(decider: Decider, router, tools: dict, messages: list[dict], context: Callable[[list[int]], object],
                n_ctx: int, fallback: Callable | None = None, tool_choice: str = "auto", parallel: bool = False,
                max_arg_tokens: int = 160, arguments: Callable | None = None, on_arguments: Callable | None = None,
                limit: int | None = None) -> Turn:
    """Decide one turn over `tools` (name -> registry Tool) routed by `router`.

    `messages`: OpenAI-style chat messages (tool calls and results included); `context(ids)`: the live context
    to decide on (one that shares a prefix with `ids` saves its prefill); `fallback(tool, step, results,
    sources) -> ArgumentsResult`: the argument decoder for a call whose in-place arguments failed (its own
    prompt, the full schema); `tool_choice`: auto | required | none | a tool name; `arguments`: replaces the argument
    decoding altogether (evals that measure the decision only).

    Arguments follow the policy of `arguments.decoder`: in place, wrapped up in `max_arg_tokens` and going on to
    the larger budget while the JSON is open; then, unless they were streamed, `fallback`; a miss leaves the
    call's arguments None and its `problem` naming the missing value. `on_arguments(index, tool, live)` is called
    as call `index`'s arguments begin and returns `show(piece) -> bool`, called with each piece as it is decoded
    (True: the caller showed it to its client; then the call is never decoded again). `live` says whether it may
    show them: only where nothing shown can be taken back (the first call, which no later check drops, of a
    schema the grammar enforces whole). `limit`: the client's max_tokens, capping both budgets.
    """
    from nexus_agent.openai_api import render_messages

    d = retrieve(router, messages, decider.profile.k)
    cands = top_k(d, tools, decider.profile, len(tools))
    if tool_choice in tools and all(c.name != tool_choice for c in cands):
        cands.insert(0, Candidate(tools[tool_choice], 0.0, 0))
    ids, spans = decision_prompt(decider, messages, cands)
    if len(ids) + 64 > n_ctx:
        raise PromptTooLong(f"this model's context holds {n_ctx} tokens; the messages and the {len(cands)} tools "
                            f"shown take {len(ids)}")
    def beside():  # built only where the conversation's own reading decides text
        return reading_prompts(decider, messages, cands)
    results = tool_results(messages)
    step = last_user(messages)
    made = calls_made(messages)
    sources = [Source("request", step)] + [Source("observation", r) for r in results]

    budget, larger = budgets(max_arg_tokens, limit)
    shown: list[bool] = []  # per call begun: did the caller show its pieces as they came
    decoded: list[str] = []  # per call begun: its arguments as decoded in place
    drafts: list[tuple[int, int]] = []  # per call begun: tokens drafts fed ahead, and of them kept

    def in_place(tool, live, at, logits):
        schema = tool.input_schema or {"type": "object"}
        index = len(shown)
        shown.append(False)
        sink = None
        if on_arguments is not None:
            again = any(c.name == tool.name for c in made)  # a repeat may yet be dropped: not live
            show = on_arguments(index, tool, index == 0 and grammar_enforces(schema) and not again)

            def sink(piece: str) -> None:
                if show(piece):
                    shown[index] = True
        r = decode_in_place(live, at, logits, tool, sources, budget, on_token=sink, extend_to=larger,
                            earlier=list(decoded))
        args, problem, text, cut = r.arguments, r.problem, r.text, r.cut
        decoded.append(text)
        drafts.append((r.fed, r.kept))
        if args is None and fallback is not None and not shown[index]:  # its own prompt, the full schema
            res = fallback(tool, step, results, sources, limit=limit)
            args, problem = res.arguments, res.missing
            text = json.dumps(args, ensure_ascii=False) if args is not None else text
        elif args is None:
            problem = describe_miss(text, schema, problem, cut)
        return args, problem, text

    live = context(ids)
    ids = respelled(live.ids, ids, token_bytes(decider.tok), max((e for _, e in spans), default=0))
    decision, held, logits = decider.decide(live, ids, cands, d.score, d.margin, arguments or in_place,
                                            tool_choice, parallel, spans, step, made, beside, d.steps)
    decision.drafts = drafts
    if decision.kind == "call":
        live.ids = held[: live.session.n_past]
        if shown and shown[0] and decision.calls:
            decision.calls[0].streamed = True
    elif messages and messages[-1]["role"] == "tool":  # an answer that reports the results: its own prompt
        from nexus_agent.prompts import results_answer_messages

        ids = decider.tok.encode_chat(results_answer_messages(messages))
        live = context(ids)  # where the caller keeps several contexts, the decision's keeps the tools prompt
        logits = live.prefill(ids)
    elif decision.how == "model" and (decision.p_call or 0.0) >= 0.5:  # the model would call: answer without tools
        ids = decider.tok.encode_chat(render_messages(messages))
        live = context(ids)
        logits = live.prefill(ids)
    return Turn(decision, ids, logits, live)
