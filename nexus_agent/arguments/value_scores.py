"""The model's own judgement of whole values, for copy-aware decoding (`copying.CopyBias`): the mean
log-likelihood of candidates written whole (numbers, enum values), best bound first; and the value the model
writes on its own where the copy bias alone would overrule it, with whether that value is a copy behind a prefix
the model knows."""

from __future__ import annotations

import heapq
import re

import numpy as np

from nexus_agent.arguments.closers import close_logprob


def whole_scores(session, logits: np.ndarray, items: list, closers: np.ndarray, prune: bool = True) -> list:
    """[(total, tokens, where)] for candidates written whole (numbers, enum values): `items` are (tokens, prior,
    where); a total is the mean log-likelihood per token of the tokens and then a closer (as `CopyBias._score`), plus
    the prior.

    Best bound first: a mean is at most the log-likelihoods known so far over its length (the others are
    never above 0), the first token's known from `logits`. The candidate with the best bound is run through
    the model; that pass also gives the next token of every candidate sharing a prefix with it (the numbers
    13, 14 and 15 after a pass over 13), which tightens their bounds. Once the best bound is a whole score it
    is the best: the same pick as scoring every candidate (`prune` False does that), in one or two passes
    where a request writing 50 numbers took a pass per number for every value."""
    first = log_softmax(logits)
    n0 = session.n_past
    known = [[float(first[t[0]])] for t, _, _ in items]  # log-likelihoods of the tokens, then of closing

    def bound(i: int) -> float:
        return sum(known[i]) / (len(items[i][0]) + 1) + items[i][1]

    heap = [(-bound(i), i, 1) for i in range(len(items))]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i, n = heapq.heappop(heap)
        if n != len(known[i]):
            continue  # a stale entry: the candidate was pushed again with a tighter bound
        toks, prior, where = items[i]
        if n == len(toks) + 1:  # whole: no bound left above it
            out.append((bound(i), toks, where))
            if prune:
                break
            continue
        fed_prefix = getattr(session, "fed_prefix", None)  # a draft fed ahead: its logits are free
        served = fed_prefix(toks) if fed_prefix is not None else 0
        passed = toks[:served] if n <= served < len(toks) else toks  # a free partial pass may settle it
        rows = session.forward_logits(passed)
        session.remove(n0, session.n_past)
        lsm: dict[int, np.ndarray] = {}
        for j, (other, _, _) in enumerate(items):
            m = 0
            while m < min(len(other), len(passed)) and other[m] == passed[m]:
                m += 1
            lps, grew = known[j], False
            while len(lps) < len(other) and len(lps) <= m:
                r = lsm.setdefault(len(lps) - 1, log_softmax(rows[len(lps) - 1]))
                lps.append(float(r[other[len(lps)]]))
                grew = True
            if len(lps) == len(other) and m == len(other):  # the pass went through all of it: its close
                r = lsm.setdefault(len(other) - 1, log_softmax(rows[len(other) - 1]))
                lps.append(close_logprob(r, closers))
                grew = True
            if grew:
                heapq.heappush(heap, (-bound(j), j, len(lps)))
    return out


def own_value(session, tb: list[bytes], logits: np.ndarray, limit: int = 16) -> bytes | None:
    """The string the model writes here on its own (greedy, no bias; `tb`: each token's bytes) up to its closing
    quote; None when it does not close within `limit` tokens. The passes are removed from the session again."""
    n0, out, t = session.n_past, b"", int(np.argmax(logits))
    try:
        for _ in range(limit):
            b = tb[t]
            if b'"' in b:
                return out + b[: b.index(b'"')]
            out += b
            t = int(np.argmax(session.forward_logits([t])[-1]))
    finally:
        session.remove(n0, session.n_past)
    return None


def extends_copy(own: bytes, copy: bytes) -> bool:
    """Whether the model's own value is the copy with a prefix the request does not write, joined at a separator
    (`Asia/Tokyo` for "Tokyo": the namespace a timezone needs, which the model knows and the request leaves out)."""
    return len(own) > len(copy) + 1 and own.endswith(copy) and own[-len(copy) - 1:-len(copy)] in (b"/", b":", b".")


_WORD = re.compile(rb"\w+")


def words(text: bytes) -> set[bytes]:
    """The words of `text`, in small letters (what `respells_copy` compares with the sources')."""
    return {w.lower() for w in _WORD.findall(text)}


def _carries_value(word: bytes) -> bool:
    """A digit or a capital in it: `47`, `Paris`, `x-7`."""
    return any(48 <= c <= 57 or 65 <= c <= 90 for c in word)


def _valued_chunks(text: bytes) -> list[bytes]:
    """The whitespace-separated pieces of `text` that carry a value of their own (a digit or a capital in them:
    `47`, `Paris`, `/tmp/x-7/repo_a`), without the punctuation around them."""
    out = []
    for chunk in text.split():
        core = chunk.strip(b".,;:!?\"'()[]{}")
        if _carries_value(core):
            out.append(core)
    return out


def respells_copy(own: bytes, copy: bytes, source_words: set[bytes]) -> bool:
    """Whether the model's own value writes the copy's values in its own form, from the sources' words alone:
    every word of it is a word of a source, each piece of the copy that carries a value (`_valued_chunks`) is in
    it whole, it carries no value the copy does not (a digit or a capital in a word), and it is not the copy
    (`23*47+12` for "23 times 47 plus 12", `orders` for "the orders table"; not `x-7/repo_a` for
    "/tmp/x-7/repo_a", nor "Super Mario Bros. 1985" for "Super Mario Bros.", whose year is another parameter's).
    Such a value invents nothing the copy would have prevented; the copy would have written the request's prose
    where the parameter wants its form."""
    found = _WORD.findall(own)
    if not found or own == copy or not words(own) <= source_words:
        return False
    valued = {w.lower() for w in found if _carries_value(w)}
    return valued <= words(copy) and all(c in own for c in _valued_chunks(copy))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = np.max(x[np.isfinite(x)]) if np.isfinite(x).any() else 0.0
    return x - (m + np.log(np.sum(np.exp(x - m))))
