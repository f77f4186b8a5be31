"""Priors on a candidate copy, beside the model's likelihood: how requests introduce their values.

`CopyBias` ranks the copies a value may take by the model's mean log-likelihood per token; these priors add
what a 135M model does not read reliably:
- a value copied already is less likely again, and numbers (and values of one enum) fill parameters in the
  order the request writes them (`overlap_prior`, with `sibling_rank`);
- joining words end a value ("apples *with the* body": `joiners`);
- a word naming a parameter comes right before its value or right after it ("titled *apples*", "*28* days":
  `anchor`).

A copy is `where = (source, start, end)`: byte offsets into the source's escaped text.
"""

from __future__ import annotations

import json
import re

from nexus_agent.arguments.copy_sources import name_words, names_word
from nexus_agent.arguments.json_cursor import json_types, schema_at

USED_PENALTY = 2.0
ORDER_PENALTY = 1.0
# Words that join the values of a request rather than belong to one ("titled apples *with* the body ...").
JOINERS = frozenset(b"a an and as at by for from in into of on or than that the then to via which with".split())
JOINER_TEXT = frozenset(w.decode() for w in JOINERS)
_QUOTES = b"'`\""
_PUNCT = ",.;:?!'\"`()"


def overlaps(used: list[tuple[int, int, int]], k: int, start: int, end: int) -> bool:
    """Whether bytes start..end of source `k` overlap a copy in `used`."""
    return any(kk == k and s < end and start < e for kk, s, e in used)


def taken(used: list[tuple[int, int, int]], k: int, p: int) -> bool:
    """Whether position `p` of source `k` lies in a copy in `used` (a number fills one parameter)."""
    return any(kk == k and s <= p < e for kk, s, e in used)


def overlap_prior(used: list[tuple[int, int, int]], where: tuple[int, int, int], rank: int | None,
                  positions: list[tuple[int, int]]) -> float:
    """-USED_PENALTY for a copy that overlaps one made already; and, when the parameter is the `rank`-th of
    its kind among its siblings (`sibling_rank`), ORDER_PENALTY per place the copy's position among
    `positions` (the candidates' (source, start), same source) is off that rank."""
    k, start, end = where
    prior = -USED_PENALTY if overlaps(used, k, start, end) else 0.0
    if rank is not None:
        mine = sorted({p for kk, p in positions if kk == k})
        if start in mine:
            prior -= ORDER_PENALTY * abs(mine.index(start) - rank)
    return prior


def joiners(text: bytes, start: int, end: int) -> int:
    """How many words of the span `text[start:end]`, past its first, are JOINERS (a quoted text is copied
    whole: 0). The model's likelihood runs a copy on into the next value ("apples with the body"), as a
    copying model continues whatever it copies; the words that join a request's values mark where one ends."""
    if start > 0 and text[start - 1] in _QUOTES:
        return 0
    return sum(w.lower().strip(b",.;:") in JOINERS for w in text[start:end].split()[1:])


def anchor(text: bytes, start: int, end: int, schema: dict, path: tuple) -> int:
    """Requests name a parameter, then give its value. For the value at `path`: +1 when the nearest word
    before the span that names a parameter names this one ("titled *apples*", "the repository at */tmp/r*"),
    -2 when it names a sibling ("the body *'buy apples'*" for the title: as if that sibling had used it), 0
    when none of the 3 words before it names one; -1 per word of the span that names a sibling (a label,
    not a value); after an unquoted span, the word right after it is a label as well ("*28* days": +1 for
    `days`, -2 for `date`)."""
    if not path or path[-1] == "[]":
        return 0
    mine, others = _labels(schema, path)
    score = _nearest(reversed(text[:start].decode("utf-8", "ignore").split()[-3:]), mine, others)
    inside = text[start:end].decode("utf-8", "ignore").split()
    score -= sum(any(names_word(w, o) for o in others) for w in inside)  # it holds a sibling's label
    quoted = start > 0 and text[start - 1] in _QUOTES
    after = text[end:].decode("utf-8", "ignore").split()[:1]
    if quoted or not after or after[0].lower().strip(_PUNCT) in JOINER_TEXT:
        return score
    return score + _nearest(after, mine, others)  # a label right after: "*28* days"


def anchor_bound(text: bytes, start: int, schema: dict, path: tuple) -> int:
    """The most `anchor` gives any span that starts at `start`: the words before it, plus one for a label after."""
    if not path or path[-1] == "[]":
        return 0
    mine, others = _labels(schema, path)
    before = _nearest(reversed(text[:start].decode("utf-8", "ignore").split()[-3:]), mine, others)
    return before + (0 if start > 0 and text[start - 1] in _QUOTES else 1)


def _labels(schema: dict, path: tuple) -> tuple[list[str], list[list[str]]]:
    props = schema_at(schema, path[:-1]).get("properties") or {}
    return name_words(path[-1]), [name_words(p) for p in props if p != path[-1]]


def _nearest(words, mine: list[str], others: list[list[str]]) -> int:
    """+1 when the first word that is not a joiner names this parameter, -2 when it names a sibling, else 0."""
    for word in words:
        bare = word.lower().strip(_PUNCT)
        if not bare or bare in JOINER_TEXT:
            continue
        if names_word(word, mine):
            return 1
        return -2 if any(names_word(word, o) for o in others) else 0
    return 0


def sibling_rank(schema: dict, path: tuple, sub: dict) -> int | None:
    """The place of the parameter at `path` (schema `sub`) among the parent object's parameters of the same
    kind (numbers, or the same enum), in the schema's order; None when it has no such sibling."""
    if not path or path[-1] == "[]":
        return None
    props = schema_at(schema, path[:-1]).get("properties") or {}

    def kind(s):
        if not isinstance(s, dict):
            return None
        if s.get("enum"):
            return ("enum", json.dumps(s["enum"], sort_keys=True))
        return "number" if json_types(s) <= {"number", "integer"} and "type" in s else None

    mine = kind(sub)
    same = [name for name, s in props.items() if mine is not None and kind(s) == mine]
    return same.index(path[-1]) if len(same) > 1 and path[-1] in same else None


LIST_JOINERS = (b",", b"and ", b"or ", b"& ", b"plus ", b"as well as ")


def listed_next(text: bytes, end: int) -> bool:
    """Whether a list goes on after the span ending at `end`: a comma or a list word follows it ("a.txt, b.txt
    and c.txt"). An array item copied from a request is followed by the next item only in a list."""
    rest = text[end:].lstrip(b"'`\" ").lower()
    return rest.startswith(LIST_JOINERS)


def names_label(span: bytes, name: str) -> bool:
    """Whether every word of `span` names the parameter `name` (`copy_sources.names_word`): the request's
    label for the value ("the timezone"), never the value itself."""
    words = [w for w in re.split(rb"[^A-Za-z]+", span) if w]
    return bool(words) and all(names_word(w.decode(), name_words(name)) for w in words)
