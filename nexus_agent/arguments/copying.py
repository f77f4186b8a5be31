"""Copy-aware argument decoding: a logits bias toward values copied from the request or an earlier result.

Most argument values a request needs are written in it ("Read the file notes/plan.md", "Add 837 and 12") or
in an earlier tool result of the same turn ("... then multiply the result by 3"). A 135M model under a
grammar still invents them (`./data.csv`, `100`); it copies reliably once copying is the likely move.

`CopyBias` is a logits processor for `generate_step`. It follows the JSON being generated (`JsonCursor`) and,
while a value is being written, adds `bias` to every token that continues a *copy* (and, given the session,
ranks whole candidate copies where a value starts: the class docstring): the value so far followed
by that token is a prefix of a span of a source text (a string value starting at a word boundary, any end),
of a number written in a source (for number/integer parameters), or of an enum value the request names. A
token that closes the value right after a complete copy (the closing quote, a `,` after a number) gets the
same bias, so a copy that could go on competes with stopping by the model's own likelihood: the bias only
tilts the choice between copying and inventing, it never decides which span or where it ends. The grammar
mask runs before this processor, so a value the schema forbids stays impossible (enums, types, bounds).

Beside the model's likelihood, the ranking reads how requests introduce values (`span_priors.py`: a word
naming a parameter comes right before or right after its value, joining words end one). Which optional keys
are written follows the request too (`key_choice.py`). The sources, spans and provenance are in
`copy_sources.py`; following the JSON in `json_cursor.py`; which tokens end a value in `closers.py`.
"""

from __future__ import annotations

import re

import numpy as np

from nexus_agent.arguments.closers import close_logprob, closing, spelling, token_classes
from nexus_agent.arguments.constrained import _REFS, token_bytes
from nexus_agent.arguments.copy_sources import (
    MAX_TOKEN_BYTES,
    NUMBER,
    Source,
    _escaped,
    _word_end,
    _word_starts,
    enum_named,
    numbers_in,
)
from nexus_agent.arguments.json_cursor import JsonCursor, json_types, schema_at
from nexus_agent.arguments.key_choice import KeyChoice
from nexus_agent.arguments.span_priors import (
    USED_PENALTY,
    anchor,
    anchor_bound,
    joiners,
    listed_next,
    names_label,
    overlap_prior,
    sibling_rank,
    taken,
)
from nexus_agent.arguments.value_scores import (
    extends_copy,
    log_softmax,
    own_value,
    respells_copy,
    whole_scores,
    words,
)

DEFAULT_BIAS = 4.0  # logits; chosen on the agent suite and BFCL by `nexus eval arguments --bias` (README)
JOINER_PENALTY = 1.0  # per joining word inside a string copy (`span_priors.joiners`)
ANCHOR_BONUS = 1.0  # per point of `span_priors.anchor`
class CopyBias:
    """Logits processor: tilt decoding toward values copied from `sources` (module docstring).

    Without a `session` it adds `bias` to every token that continues a copy. With the generation's `session`
    it also ranks: where a value starts and a copy token would win under the bias, the candidate copies
    (the `rank_starts` likeliest starts, every number written in a source, every enum value the request
    names) are scored by the model's own mean log-likelihood per token of the whole value, closing quote or
    delimiter included (`_score`: one `forward_logits` pass over each candidate, then removed from the
    session), plus the priors of `span_priors`, and the best one is forced token by token. Over its first token
    alone a small model picks `file` for "the file /tmp/repo"; over the whole value it picks the path. Place
    it after the grammar mask: a forced token the grammar forbids is simply not taken, and the copy is
    dropped (the value goes on under the bias alone). Where only the bias makes a copy win at a string's start and
    the model's own value is that copy behind a prefix it knows (`Asia/Tokyo` for "Tokyo",
    `value_scores.extends_copy`), or where the model would start the copy of several words on its own but writes
    its values in its own form from the sources' words alone (`23*47+12` for "23 times 47 plus 12":
    `value_scores.respells_copy`), the value is the model's, written without the bias.
    """

    def __init__(self, tokenizer, sources: list[Source], schema: dict, bias: float = DEFAULT_BIAS,
                 session=None, rank_starts: int = 4, max_copy_tokens: int = 48):
        _REFS[id(tokenizer)] = tokenizer
        self.tokenizer = tokenizer
        self.tb = token_bytes(tokenizer)
        (self.index, self.close_str, self.close_num, self.close_obj, self.comma, self.close_arr,
         self.bracket) = token_classes(tokenizer.digest, id(tokenizer))
        self.schema, self.bias = schema or {}, bias
        self.session, self.rank_starts, self.max_copy_tokens = session, rank_starts, max_copy_tokens
        self.cursor = JsonCursor()
        self.seen = 0
        self.texts = [(_escaped(s.text), s.kind) for s in sources if s.text]
        self.starts = [_word_starts(b) for b, _ in self.texts]
        self.source_words = set().union(*(words(b) for b, _ in self.texts))
        self.numbers = [n for s in sources for n in numbers_in(s.text)]
        self.request = " ".join(s.text for s in sources if s.kind == "request").lower()
        self.plan: list[int] = []  # tokens still to force for the chosen copy
        self.used: list[tuple[int, int, int]] = []  # (source, start, end) of every copy ranked so far
        self.forced: int | None = None  # the token forced last
        self.close_after_plan = False
        self.decided = 0  # cursor.values of the last value ranked (or left to the model)
        self.boosted = 0  # steps at which some token was boosted
        self.ranked: list[dict] = []  # one entry per ranked value: the candidates and the pick (for the trace)
        self.own: int | None = None  # cursor.values of the string value left to the model, bias off
        self.item: tuple[int, int, int] | None = None  # the span the last string array item copied
        self.number_item: tuple[int, int, int] | None = None  # the span the last number array item copied
        self.prune = True  # skip whole-value candidates whose bound cannot win (`_rank`); False: score all
        self.keys = KeyChoice(self.schema, self.cursor, self.request, self.texts, self.used, self.index,
                              self.close_obj, self.comma, bias)

    def _string_copies(self, content: bytes) -> list[tuple[bytes, tuple[int, int]]]:
        """(remainder, (source, start)) of the source spans that begin with `content` (the string value so
        far), in source order. A span stops before a quote that it did not open: a quoted value is copied
        whole or not at all, and an unquoted span does not run into one (`apples with the body 'buy…`)."""
        out, seen = [], set()
        for k, ((text, _), starts) in enumerate(zip(self.texts, self.starts)):
            for p in starts:
                end = p + len(content)
                if text[p:end] != content:
                    continue
                stop = next((i for i in range(max(end, p + 1), len(text)) if text[i] in b"'`\""), len(text))
                if stop > 0 and text[stop - 1] == 0x5C:  # an escaped quote: stop before its backslash
                    stop -= 1
                rest = text[end:stop]
                if rest and rest not in seen:
                    seen.add(rest)
                    out.append((rest, (k, p)))
        return out

    def _enum_spans(self, content: bytes, sub: dict) -> list[tuple[bytes, tuple[int, int]]]:
        """(remainder, (source, position)) of the enum values a request source names (case-insensitive)."""
        out = []
        for k, (text, kind) in enumerate(self.texts):
            if kind != "request":
                continue
            low = text.lower()
            for v in sub.get("enum") or []:
                if not isinstance(v, str) or not v:
                    continue
                b = _escaped(v)
                for m in re.finditer(rb"(?<!\w)" + re.escape(b.lower()) + rb"(?!\w)", low):
                    if b.startswith(content) and b != content:
                        out.append((b[len(content):], (k, m.start())))
        return out

    def _number_copies(self, prefix: bytes, types: set[str]) -> list[tuple[bytes, tuple[int, int]]]:
        """(remainder, (source, position)) of the numbers written in the sources that begin with `prefix`."""
        out = []
        for k, (text, _) in enumerate(self.texts):
            for m in NUMBER.finditer(text):
                lit = m.group(0).replace(b",", b"")
                if ("number" in types or b"." not in lit) and lit.startswith(prefix) and lit != prefix \
                        and not taken(self.used, k, m.start()):
                    out.append((lit[len(prefix):], (k, m.start())))
        return out

    def candidates(self, prefix: bytes, sub: dict) -> tuple[set[int], bool]:
        """(token ids that continue a copy of the value `prefix`, whether closing the value now ends one)."""
        types = json_types(sub)
        ids: set[int] = set()
        closes = False

        def extend(remaining: bytes) -> None:
            for n in range(1, min(MAX_TOKEN_BYTES, len(remaining)) + 1):
                ids.update(self.index.get(remaining[:n], ()))

        if "string" in types and prefix[:1] in (b"", b'"'):
            content = prefix[1:]
            for b in enum_named(sub, self.request):
                if b.startswith(content):
                    rest = b[len(content):]
                    extend(rest if prefix else b'"' + rest)
                    closes |= bool(prefix) and not rest
            if "enum" not in sub:
                for (text, _), starts in zip(self.texts, self.starts):
                    for p in starts:
                        end = p + len(content)
                        if text[p:end] != content:
                            continue
                        extend(text[end:] if prefix else b'"' + text[p:])
                        closes |= bool(content) and _word_end(text, end)
        if types & {"number", "integer"} and prefix[:1] != b'"':
            free = self._numbers(types) if prefix else {
                m.group(0).replace(b",", b"") for k, (text, _) in enumerate(self.texts)
                for m in NUMBER.finditer(text) if not taken(self.used, k, m.start())
                and ("number" in types or b"." not in m.group(0))}
            for lit in free:
                if lit.startswith(prefix):
                    rest = lit[len(prefix):]
                    extend(rest)
                    closes |= bool(prefix) and not rest
        return ids, closes

    def _numbers(self, types: set[str]) -> list[bytes]:
        return [n for n in self.numbers if "number" in types or b"." not in n]

    # -- ranking (with a session) ---------------------------------------------------------------------------
    def _score(self, logits: np.ndarray, remainders: list[tuple[bytes, tuple]], string: bool, word_ends: bool):
        """[(score, tokens, where)] of the copies of each remainder, one per place the copy may end (word ends
        when `word_ends`, else only the whole remainder): the model's mean log-likelihood per token of
        writing it and then closing the value. `_rank` adds the priors of each end and takes the best.

        The mean, not the sum: a sum favours any short span over the right long one (a path's inner tokens
        each cost something), and scoring only the start and the stop lets a common first word win
        ("file" before "/tmp/repo"). Measured on the agent suite's templates (README, "Arguments").
        """
        closers = self.close_str if string else self.close_num
        n0 = self.session.n_past
        first = log_softmax(logits)
        out = []
        for rest, where in remainders:
            k, p = where
            quoted = p > 0 and self.texts[k][0][p - 1] in b"'`\""  # a quoted text is copied whole
            ends = word_ends and not quoted
            toks = self.tokenizer.encode(rest.decode("utf-8", "ignore"))[: self.max_copy_tokens]
            if not toks:
                continue
            logits_after = self.session.forward_logits(toks)
            self.session.remove(n0, self.session.n_past)
            total, written = 0.0, b""
            for i, t in enumerate(toks):
                total += float(first[t] if i == 0 else log_softmax(logits_after[i - 1])[t])
                written += self.tb[t]
                if not rest.startswith(written):
                    break
                whole = len(written) == len(rest)
                if (ends and _word_end(rest, len(written))) or whole:
                    lp = log_softmax(logits_after[i])
                    close = close_logprob(lp, closers)
                    mean = (total + close) / (i + 2)
                    out.append((mean, toks[: i + 1], where))
                if whole:
                    break
        return out

    def _rank(self, logits: np.ndarray, prefix: bytes, sub: dict, ids: set[int]) -> None:
        """Decide the value that starts at `prefix`: leave it to the model when its best token is not a copy
        under the bias, else plan the likeliest whole copy."""
        if not ids:
            return
        boosted = np.zeros(len(logits), dtype=bool)
        boosted[[i for i in ids if i < len(logits)]] = True
        best_copy = float(np.max(np.where(boosted, logits, -np.inf))) + self.bias
        best_free = float(np.max(np.where(boosted, -np.inf, logits)))
        if best_copy < best_free:
            return
        string = prefix[:1] == b'"'
        rank = sibling_rank(self.schema, self.cursor.path(), sub) if (not string or "enum" in sub) else None
        if string and "enum" in sub:
            cands = self._enum_spans(prefix[1:], sub)
        elif string:
            cands = self._string_copies(prefix[1:])
            first = log_softmax(logits)
            head = [max((first[i] for n in range(1, min(MAX_TOKEN_BYTES, len(r)) + 1)
                         for i in self.index.get(r[:n], ())), default=-np.inf) +
                    overlap_prior(self.used, (*w, w[1] + 1), None, []) for r, w in cands]
            order = np.argsort(-np.array(head), kind="stable")[: self.rank_starts] if cands else []
            cands = [cands[i] for i in order]
        else:
            cands = self._number_copies(prefix, json_types(sub))
        if self.cursor.path()[-1:] == ("[]",):  # an array item: never a copy the array (or a key) took already
            cands = [(r, (k, p)) for r, (k, p) in cands if not taken(self.used, k, p)]
        positions = [w for _, w in cands]
        numeric_left = string and bool(self.keys.left(lambda t: t & {"number", "integer"}))
        done = len(prefix) - (1 if string else 0)  # value bytes already written before the copy
        scored = []
        label = [w for w in self.cursor.path() if w != "[]"][-1:]
        own = not string and self._request_suffices(json_types(sub))

        def prior_of(k: int, span: tuple[int, int, int]) -> float | None:
            """The priors of copying `span` of source `k` here; None: the span is the parameter's label."""
            if string and "enum" not in sub and label and names_label(self.texts[k][0][span[1]:span[2]], label[0]):
                return None  # the word that names the parameter is its label, not its value ("the timezone")
            prior = overlap_prior(self.used, span, rank, positions)
            if string and "enum" not in sub:
                prior -= JOINER_PENALTY * joiners(self.texts[k][0], span[1], span[2])
                if numeric_left and NUMBER.fullmatch(self.texts[k][0][span[1]:span[2]]):
                    prior -= USED_PENALTY  # a number is for the numeric parameter still to come
            if own and self.texts[k][1] != "request":
                prior -= USED_PENALTY  # the request names a number for every numeric value left: its own
            return prior + ANCHOR_BONUS * anchor(self.texts[k][0], span[1], span[2], self.schema, self.cursor.path())

        def add(items) -> None:
            for s, toks, (k, p) in self._score(logits, items, string, word_ends=string and "enum" not in sub):
                span = (k, p, p + done + sum(len(self.tb[t]) for t in toks))
                prior = prior_of(k, span)
                if prior is not None:
                    scored.append((s + prior, toks, span))

        if string and "enum" not in sub:
            # A free string may end at any word. Its total is at most its priors' bound (the model's mean is
            # never above 0): each joining word inside it costs JOINER_PENALTY, and its anchor is at most
            # `anchor_bound`. So each start after the first is scored only up to the first word that takes that
            # bound below the best total so far: the same pick, without a pass over the request's whole tail
            # after every start.
            for rest, (k, p) in cands:
                if self.prune and scored:
                    top = ANCHOR_BONUS * anchor_bound(self.texts[k][0], p, self.schema, self.cursor.path())
                    rest = rest[: self._tail_cut(rest, k, p, done, max(x[0] for x in scored) - top)]
                if rest:
                    add([(rest, (k, p))])
        else:
            items = []
            for rest, (k, p) in cands:
                toks = self.tokenizer.encode(rest.decode("utf-8", "ignore"))[: self.max_copy_tokens]
                if b"".join(self.tb[t] for t in toks) != rest:
                    continue  # its tokens do not spell it (or it is longer than max_copy_tokens)
                prior = prior_of(k, (k, p, p + done + len(rest)))
                if prior is not None:
                    items.append((toks, prior, (k, p, p + done + len(rest))))
            closers = self.close_str if string else self.close_num
            scored += whole_scores(self.session, logits, items, closers, self.prune)
        if not scored:
            return
        score, toks, where = max(scored, key=lambda s: s[0])
        copy = b"".join(self.tb[t] for t in toks)
        biased = best_free > best_copy - self.bias  # only the bias made a copy win here
        if string and "enum" not in sub and not done and (biased or b" " in copy.strip()):
            own = own_value(self.session, self.tb, logits)  # (a copy of words may be prose around its values)
            if own is not None and (extends_copy(own, copy) if biased else
                                    respells_copy(own, copy, self.source_words)):
                self.own = self.cursor.values
                self.ranked.append({"value": prefix.decode("utf-8", "replace"), "candidates": len(scored),
                                    "pick": own.decode("utf-8", "replace"), "logp": None, "own": True,
                                    "top": [(copy.decode("utf-8", "replace"), round(score, 3))]})
                return
        self.used.append(where)
        in_array = self.cursor.path()[-1:] == ("[]",)
        self.item = where if string and in_array else None  # a string array's item
        self.number_item = where if in_array and not string else None  # a number array's (arrays may nest)
        self.plan = list(toks)
        self.close_after_plan = True
        top = sorted(scored, key=lambda s: -s[0])[:4]
        self.ranked.append({"value": prefix.decode("utf-8", "replace"), "candidates": len(scored),
                            "pick": copy.decode("utf-8", "replace"),
                            "logp": round(score, 3),
                            "top": [(b"".join(self.tb[t] for t in c).decode("utf-8", "replace"), round(v, 3))
                                    for v, c, _ in top]})

    def _tail_cut(self, rest: bytes, k: int, p: int, done: int, floor: float) -> int:
        """How many bytes of `rest` (the copy at byte `p` of source `k`, `done` bytes of it written) may end a
        copy whose joining words cost no more than `-floor`: whole words, up to the first that costs more."""
        cut = 0
        for m in re.finditer(rb"\S+", rest):
            if -JOINER_PENALTY * joiners(self.texts[k][0], p, p + done + m.end()) < floor:
                break
            cut = m.end()
        return cut

    def bind(self, view) -> None:
        """Rank through `generate_step`'s view of the session (`native.generate.AheadView`): a candidate already
        fed ahead (a draft of the request's next values) is scored from its logits without a pass of its own."""
        if self.session is not None:
            self.session = view

    def ahead(self, tokens: list[int]) -> list[int]:
        """The copy's tokens still to force after `tokens` (whose last is the one just forced): `generate_step`
        feeds them in one forward pass."""
        return list(self.plan) if self.plan and tokens and tokens[-1] == self.forced else []

    def _request_suffices(self, types: set[str]) -> bool:
        """Whether the request still holds an untaken number for this value and every numeric key left. Then an
        earlier result's number is not what the step asks for ("convert 5 km to mi" after a result of 42 takes 5;
        "multiply the result by 3" has one number for two keys, so the result may fill one)."""
        wanted = 1 + len(self.keys.left(lambda t: bool(t & {"number", "integer"})))
        have = sum(1 for k, (text, kind) in enumerate(self.texts) if kind == "request"
                   for m in NUMBER.finditer(text) if not taken(self.used, k, m.start())
                   and ("number" in types or b"." not in m.group(0)))
        return have >= wanted

    def _force(self, logits: np.ndarray) -> np.ndarray:
        out = logits.copy()
        if self.plan:
            self.forced = self.plan.pop(0)
            if self.forced < len(out):
                out[self.forced] += 1e4
            return out
        # the copy is written: close it (the grammar keeps only the closers valid here)
        self.close_after_plan = False
        self.forced = None
        closers = self.close_str if self.cursor.in_string else self.close_num
        n = min(len(out), len(closers))
        out[:n] = np.where(closers[:n], out[:n] + 1e4, out[:n])
        item = next((i for i in (self.item, self.number_item) if i is not None and i == self.used[-1]), None)
        if item is not None:  # an array item: does the request list more right after it (where the request
            # closes brackets itself, as in a matrix, the closers it writes: "], [" closes that row only)
            text = self.texts[item[0]][0]
            written = closing(text, item[2])
            if written.startswith(b"]"):
                pick = closers[:n] & spelling(self.tb, closers[:n], written)
            else:
                more = listed_next(text, item[2])
                pick = closers[:n] & (self.comma[:n] & ~self.bracket[:n] if more else
                                      self.bracket[:n] & ~self.comma[:n])
            out[:n] = np.where(pick, out[:n] + 1e3, out[:n])
        return self.keys.closer_tilt(out, closers)

    def _close_array(self, logits: np.ndarray) -> np.ndarray:
        """The request names no further item after the one just copied: close the array where the grammar
        allows (an array of strings otherwise keeps taking the request's other words as items)."""
        n = min(len(logits), len(self.close_arr))
        out = logits.copy()
        out[:n] = np.where(self.close_arr[:n] & np.isfinite(out[:n]), out[:n] + 1e4, out[:n])
        return out

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        for t in tokens[self.seen:]:
            self.cursor.feed(self.tb[t])
        self.seen = len(tokens)
        if self.forced is not None and (not tokens or tokens[-1] != self.forced):
            self.plan, self.close_after_plan = [], False  # the grammar took another token: the copy is off
        self.forced = None
        if self.plan or self.close_after_plan:
            return self._force(logits)
        prefix = self.cursor.value_prefix()
        if self.bias == 0:
            return logits
        if prefix is None:
            if self.item is not None and self.cursor.between_items() and not listed_next(self.texts[self.item[0]][0],
                                                                                         self.item[2]):
                return self._close_array(logits)
            return self.keys(logits)
        if self.own == self.cursor.values and prefix[:1] == b'"':
            return logits  # the model's own value (`_rank`): written without the bias
        sub = schema_at(self.schema, self.cursor.path())
        ids, closes = self.candidates(prefix, sub)
        if self.session is not None:
            types = json_types(sub)
            key = (self.cursor.values if prefix[:1] == b'"' and types == {"string"} else
                   self.cursor.values + 1 if prefix == b"" and types and types <= {"number", "integer"} else None)
            if key is not None and key != self.decided:  # a value starts: rank its copies once
                self.decided = key
                self._rank(logits, prefix, sub, ids)
                if self.plan:
                    return self._force(logits)
                if self.own == self.cursor.values:
                    return logits
        if not ids and not closes:  # a literal or number the model wrote itself may end here: one more key?
            return self.keys.closer_tilt(logits.copy(), self.close_num, tilt=False) if _complete(prefix) else logits
        boost = np.zeros(len(logits), dtype=bool)
        if ids:
            boost[[i for i in ids if i < len(logits)]] = True
        if closes:
            closers = self.close_str if prefix[:1] == b'"' else self.close_num
            boost[: len(closers)] |= closers[: len(logits)]
        self.boosted += 1
        out = np.where(boost, logits + self.bias, logits)
        return self.keys.closer_tilt(out, self.close_str if prefix[:1] == b'"' else self.close_num) if closes else out


_COMPLETE = re.compile(rb"true|false|null|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _complete(prefix: bytes) -> bool:
    """Whether `prefix` (a value being written outside a string) is a whole JSON literal or number."""
    return _COMPLETE.fullmatch(prefix) is not None
