"""Conversation-aware retrieval: the query the router sees for the current turn.

The last user message is routed as it is. A follow-up ("do the same for Paris", "and in the other repo?")
names no tool by itself, so when an earlier user turn exists the two are also routed together, and the
candidates of both queries are merged by their best score. Tool results after the last user message (the
turn's own calls) are appended to the joint query: the next call often acts on what the last one returned.
"""

from __future__ import annotations

from dataclasses import replace

RESULT_CHARS = 200


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


def retrieve(router, messages: list[dict]):
    """The router's decision for the last user message with the candidates of the conversation-aware
    queries merged in (best score per tool, best first)."""
    queries = turn_queries(messages) or [""]
    first = router.route(queries[0])
    if len(queries) == 1:
        return first
    best = {c[0]: c for c in first.candidates}
    for q in queries[1:]:
        for c in router.route(q).candidates:
            if c[0] not in best or c[1] > best[c[0]][1]:
                best[c[0]] = c
    merged = sorted(best.values(), key=lambda c: -c[1])[: max(len(first.candidates), 1)]
    return replace(first, candidates=merged)
