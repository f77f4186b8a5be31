"""Drafts of what the arguments copy next, read from the request: verified, never forced.

Arguments copy long runs of the request: a matrix, a list of numbers, a sentence to translate. Under the
copy bias each value is still one decode per token, and a value ranked from the request's numbers costs a
pass of its own (`value_scores.whole_scores`). `SourceDraft` finds where the arguments written so far end the same way
as some place of a source (the request, an earlier result; also as the request would be written in compact
JSON, `[[1, 2], [3, 4]]` as `[[1,2],[3,4]]`) and names the tokens that follow there as `ahead`: `generate_step`
feeds them in one forward pass, the processors still run on each position, and a token they do not pick ends
the draft there. The text decoded is the one decoded token by token; what a draft saves is passes (one pass
over a dozen tokens costs about two single decodes of a small model on a CPU), and a `CopyBias` reads its
ranking passes for drafted values from the fed logits (`copying.CopyBias.bind`).
"""

from __future__ import annotations

import json
import re
from typing import Sequence

import numpy as np

from nexus_agent.arguments.constrained import token_bytes
from nexus_agent.arguments.copy_sources import Source, _escaped
from nexus_agent.arguments.copying import CopyBias
from nexus_agent.arguments.schema_echo import SchemaEcho

_SPACED = re.compile(r"([,:])[ \t]+")


def variants(text: str) -> list[bytes]:
    """`text` as the bytes a JSON string holds, and as compact JSON writes its lists and objects."""
    out = [_escaped(text)]
    compact = _escaped(_SPACED.sub(r"\1", text))
    if compact != out[0]:
        out.append(compact)
    return out


class SourceDraft:
    """Logits processor that changes no logits: its `ahead(tokens)` is the draft after `tokens` (module docstring),
    also after the tokens the grammar forces or a copy plans (`extends`). `min_match`: bytes the arguments' end must
    share with the source; `max_tokens`: the longest draft. A draft that is taken whole doubles the next one's
    length, one that is not sets it one past what was taken (a token fed and not taken costs about a fifth of a
    pass); a place whose draft was refused at its first token is not drafted from again; a drafted token the model
    wrote in two (`],[` as `],` and `[`) is drafted as it wrote it from then on. Among places that end the same way,
    the one after the last draft's end comes first (a list is copied in its order)."""

    def __init__(self, tokenizer, sources: list[Source], min_match: int = 3, max_tokens: int = 16,
                 earlier: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.tb = token_bytes(tokenizer)
        self.texts, self.compact = [], []  # each source's variants; whether it is the compact one
        for src in sources:
            for i, v in enumerate(variants(src.text) if src.text else ()):
                self.texts.append(v)
                self.compact.append(i > 0)
        self.n_src = len(self.texts)  # the earlier calls' texts follow the sources' (their places k >= n_src)
        self.earlier = [t.encode("utf-8") for t in earlier if t]
        self.texts += self.earlier
        self.min_match, self.max_tokens = min_match, max_tokens
        self.length = 4  # the next draft's length: doubled after a draft taken whole, else one past what was taken
        self.written = b""
        self.toks: list[int] = []  # the tokens the arguments' text was last followed through
        self.ends = [0]  # the text's length after each of them
        self.pending: tuple[tuple[int, int], list[int], int] | None = None  # (place, draft, tokens seen then)
        self.refused: set[tuple[int, int]] = set()
        self.splits: dict[int, list[int]] = {}  # a drafted token -> the tokens the model wrote it as
        self.last = _after_earlier(self.texts[: self.n_src], earlier)  # (source, byte) the last draft was taken to
        self.log: list[tuple[int, int]] = []  # (drafted, taken) per draft

    extends = True

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        return logits

    def _follow(self, tokens: list[int]) -> None:
        n = 0  # asked ahead of the tokens taken (`extends`), the tokens may differ from the last call's
        while n < min(len(tokens), len(self.toks)) and tokens[n] == self.toks[n]:
            n += 1
        del self.toks[n:], self.ends[n + 1:]
        self.written = self.written[: self.ends[-1]]
        for t in tokens[n:]:
            self.toks.append(t)
            self.written += self.tb[t] if t < len(self.tb) else b""
            self.ends.append(len(self.written))
        if self.pending is not None:
            place, draft, at = self.pending
            if len(tokens) > at:
                if tokens[at] != draft[0]:
                    self.refused.add(place)
                self.pending = None
                n = 0
                while at + n < len(tokens) and n < len(draft) and tokens[at + n] == draft[n]:
                    n += 1
                if place[0] < self.n_src:  # a source's place, not an earlier call's
                    self.last = (place[0], place[1] + sum(len(self.tb[t]) for t in draft[:n]))
                if n < len(draft) and at + n < len(tokens):  # the model split a drafted token: `],` then `[`
                    mine, theirs = self.tb[draft[n]], self.tb[tokens[at + n]]
                    if len(theirs) < len(mine) and mine.startswith(theirs):
                        self.splits[draft[n]] = [tokens[at + n], *self.tokenizer.encode(
                            mine[len(theirs):].decode("utf-8", "ignore"))]
                self.log.append((len(draft), n))
                self.length = min(2 * self.length, self.max_tokens) if n == len(draft) else max(2, n + 1)

    def _place(self) -> tuple[int, int] | None:
        """(source, byte) right after the longest end of the arguments written that a source holds; a shorter
        end will do right after the place the last draft (or the turn's earlier calls) reached: the next
        matrix's `[[`."""
        for j, text in enumerate(self.earlier):  # an earlier call this one repeats so far: its rest
            k = self.n_src + j
            if len(text) > len(self.written) and text.startswith(self.written) and \
                    (k, len(self.written)) not in self.refused:
                return k, len(self.written)
        best, best_len, best_pref = None, self.min_match - 1, False
        tail = self.written[-48:]
        in_string = len(re.findall(rb'(?<!\\)"', self.written)) % 2 == 1
        for k in range(self.n_src):
            pref = self.compact[k] != in_string  # a list as compact JSON writes it; a string's words as written
            n = best_len + (0 if best is not None and pref and not best_pref else 1)
            while n <= len(tail):
                p = self._find(k, tail[-n:])
                if p < 0:
                    break
                best, best_len, best_pref = (k, p + n), n, pref
                n += 1
        k, end = self.last
        if best is None and k >= 0 and len(tail) >= 2:
            p = self.texts[k].find(tail[-2:], end)
            if p >= 0 and (k, p + 2) not in self.refused and p + 2 < len(self.texts[k]):
                best = (k, p + 2)
        return best

    def _find(self, k: int, piece: bytes) -> int:
        """Where `piece` occurs in source `k` with something after it, not at a refused place: first after
        the place the last draft reached (copies go on in the order the request lists them), else first."""
        text = self.texts[k]
        for start in ((self.last[1] - len(piece), 0) if self.last[0] == k else (0,)):
            p = text.find(piece, max(start, 0))
            while p >= 0 and ((k, p + len(piece)) in self.refused or p + len(piece) >= len(text)):
                p = text.find(piece, p + 1)
            if p >= 0:
                return p
        return -1

    def ahead(self, tokens: list[int]) -> list[int]:
        self._follow(tokens)
        place = self._place()
        if place is None:
            return []
        k, p = place
        rest = self.texts[k][p:p + 8 * self.max_tokens].decode("utf-8", "ignore")
        draft = [u for t in self.tokenizer.encode(rest) for u in self.splits.get(t, [t])][: self.length]
        if not draft:
            return []
        self.pending = (place, draft, len(tokens))
        return draft


def _after_earlier(texts: list[bytes], earlier: Sequence[str]) -> tuple[int, int]:
    """(source, byte) after the furthest value of the turn's earlier calls (`earlier`: their arguments' JSON)
    that a source holds, (-1, 0) for none: a further call copies on from there."""
    best = (-1, 0)
    for text in earlier:
        try:
            args = json.loads(text)
        except ValueError:
            continue
        for v in (args.values() if isinstance(args, dict) else ()):
            piece = _escaped(v) if isinstance(v, str) else json.dumps(v, separators=(",", ":")).encode()
            if len(piece) < 2:
                continue
            for k, t in enumerate(texts):
                p = t.find(piece)
                if p >= 0 and p + len(piece) > best[1]:
                    best = (k, p + len(piece))
    return best


def copy_processors(tokenizer, sources: list[Source], schema: dict, bias: float, session=None,
                    drafts: bool = True, earlier: Sequence[str] = ()) -> list:
    """The processors of copy-aware arguments after the grammar: the `CopyBias` (none at bias 0; ranking with
    `session`) and, with a `session`, the `SchemaEcho` (a value is not its schema restated), then, with `drafts`,
    the `SourceDraft` (last: a copy planned whole is fed ahead first), which also drafts from `earlier`, the
    arguments of the turn's earlier calls: a further call that repeats one is decoded in a pass or two (and then
    dropped by the decider) instead of token by token."""
    out = [CopyBias(tokenizer, sources, schema, bias, session)] if bias else []
    if bias and session is not None:
        request = " ".join(s.text for s in sources if s.kind == "request")
        out.append(SchemaEcho(tokenizer, schema, session, request, copies=out))
    return out + ([SourceDraft(tokenizer, sources, earlier=earlier)] if drafts else [])
