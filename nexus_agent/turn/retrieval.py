"""Conversation-aware retrieval: the query the router sees for the current turn.

The last user message is routed as it is. A follow-up ("do the same for Paris", "and in the other repo?")
names no tool by itself, so when an earlier user turn exists the two are also routed together, and the
candidates of both queries are merged by their best score. Tool results after the last user message (the
turn's own calls) are appended to the joint query: the next call often acts on what the last one returned.

A request in steps ("What time is it in Tokyo? Then show the last 3 commits") is also routed step by step
(`split_steps`): the whole request's pick answers one of its steps at best. When a step's pick is another tool than
the whole request's, the gate's margin does not make the turn sure of one tool: its path becomes "rerank", so the
model is shown the top k (`DecideProfile.shown`) and not the whole request's pick alone. The pick of each step the
gate is sure of is among those k (`make_room`); an unsure step's pick is not forced in (shown, the time step's
near-tie `convert_time` drew a wrong call). Each step's own first few candidates are kept (`Retrieved.steps`): a
further call of the turn chooses among those of the steps no earlier call took (`steps_left`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Sequence

from slb.router import RouteDecision

RESULT_CHARS = 200
MAX_STEPS = 8  # steps routed apart; the tail stays in the last one
STEP_K = 3  # candidates kept per step for a further call

_STEP_SPLIT = re.compile(r"\s*(?:;\s*(?:and\s+)?(?:then\s+)?|,?\s+and then\s+"
                         r"|,?\s+then\s+|[.?!]\s+then\s+)\s*", re.IGNORECASE)


def split_steps(request: str, max_steps: int) -> list[str]:
    """The request's steps at explicit sequencing words; the tail beyond `max_steps` stays in the last step."""
    parts = [p.strip(" .") for p in _STEP_SPLIT.split(request) if p.strip(" .")]
    if len(parts) > max_steps:
        parts = parts[: max_steps - 1] + [" then ".join(parts[max_steps - 1:])]
    return parts or [request]


def turn_queries(messages: list[dict]) -> list[str]:
    """The queries for the current turn: the last user message, then (when there is one) the earlier user
    message joined to it with the turn's tool results."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        return []
    last = messages[users[-1]]["content"]
    results = [m["content"][:RESULT_CHARS] for m in messages[users[-1] + 1:] if m["role"] == "tool"]
    queries = [last]
    context = ([messages[users[-2]]["content"]] if len(users) > 1 else []) + [last] + results
    if len(context) > 1:
        queries.append("\n".join(context))
    return queries


@dataclass
class Retrieved(RouteDecision):
    """A router decision for the turn, with `own`: each candidate's score for the last user message alone. The
    merged scores bring an earlier turn's tools in and order the candidates; a name is weighed by its own score
    (`top_k`), or a new request after an earlier turn would have the earlier turn's tool weighed for it (the
    conversation eval's second turn called the first turn's `avg_closing_price`)."""

    own: dict[str, float] = field(default_factory=dict)
    steps: list[list[str]] = field(default_factory=list)  # per step of a request in steps: its first STEP_K names


def retrieve(router, messages: list[dict], k: int = 5) -> Retrieved:
    """The router's decision for the last user message with the candidates of the conversation-aware
    queries merged in (best score per tool, best first). When the message has steps, the path is "rerank" where
    a step picks another tool than the whole message, and the pick of each step the gate is sure of is among the
    first `k` candidates (the weakest that is no such pick makes room)."""
    queries = turn_queries(messages) or [""]
    first = router.route(queries[0])
    decision = Retrieved(**vars(first), own={c[0]: c[1] for c in first.candidates})
    if len(queries) > 1:
        best = {c[0]: c for c in first.candidates}
        for q in queries[1:]:
            for c in router.route(q).candidates:
                if c[0] not in best or c[1] > best[c[0]][1]:
                    best[c[0]] = c
        merged = sorted(best.values(), key=lambda c: -c[1])[: max(len(first.candidates), 1)]
        decision = replace(decision, candidates=merged)
    steps = split_steps(queries[0], MAX_STEPS)
    if len(steps) > 1:
        parts = [router.route(s) for s in steps]
        if first.path == "auto" and any(p.tool not in (None, first.tool) for p in parts):
            decision = replace(decision, path="rerank")
        picks = [p.candidates[0] for p in parts if p.path == "auto"]
        own = {**decision.own, **{c[0]: max(c[1], decision.own.get(c[0], c[1])) for c in picks}}  # its step's
        decision = replace(decision, candidates=make_room(decision.candidates, picks, decision.tool, k), own=own,
                           steps=[[c[0] for c in p.candidates[:STEP_K]] for p in parts])
    return decision


def steps_left(steps: Sequence[list[str]], called: list[str]) -> list[list[str]]:
    """The steps (each its candidate names) that no call of `called` took: a call takes the step, not taken yet,
    where its tool ranks best (earliest step on a tie); a tool among no step's candidates takes none."""
    left = list(range(len(steps)))
    for name in called:
        at = [(steps[i].index(name), i) for i in left if name in steps[i]]
        if at:
            left.remove(min(at)[1])
    return [steps[i] for i in left]


def make_room(cands: list[tuple], picks: list[tuple], tool: str | None, k: int) -> list[tuple]:
    """`cands` with each of `picks` (candidate tuples) among the first `k`: a pick shown already stays where it is,
    another takes the place of the weakest of the first k that is neither a pick nor `tool`, which moves to the end."""
    out = list(cands)
    keep = {c[0] for c in picks} | {tool}
    for pick in picks:
        if any(c[0] == pick[0] for c in out[:k]):
            continue
        if len(out) < k:
            out.append(pick)
            continue
        at = next((i for i in range(min(k, len(out)) - 1, -1, -1) if out[i][0] not in keep), None)
        if at is None:
            break
        displaced = out[at]
        out = [c for c in out if c[0] != pick[0]]
        out[at] = pick
        out.append(displaced)
    return out
