"""The request's parts a decision weighs: the words that look like values a call takes (whether a request names
one weighs for a call; chatter rarely does), which of them earlier calls took (a further call must act on a part of
its own: a tool the turn called already is called again only on such a part). `earlier`: the decision's or the
turn's calls so far (`decide.Choice`: `.arguments`)."""

from __future__ import annotations

import re

VALUES_CAP = 1  # a request's value words counted for the call-or-text decision, at most: whether it names one (a
# count up to 3 scored better on the public data, whose requests name many values, and answered "What time is it
# in Paris?" in text: a short request names one)


def _leaves(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def _words(values) -> set[str]:
    return {w for v in values if v is not None for w in re.findall(r"\w+", str(v).lower())}


def _taken(earlier: list) -> set[str]:
    """The words of every argument value the calls in `earlier` wrote."""
    return _words(v for c in earlier for v in _leaves(c.arguments or {}))


_QUOTED = re.compile(r"[\"“`「『《]([^\"”`」』》\n]+)[\"”`」』》]"  # an apostrophe is no quote (that's, I'm)
                     r"|(?<!\w)['‘]([^'’\n]+)['’]")
_INNER = re.compile(r"\w[/@:_.\\]\w")


def _mixed_case(word: str) -> bool:
    """A name written in mixed case wherever it stands: a capital after its first letter and a small letter in it
    ("arXiv", "iPhone", "GitHub"; not "OK", "SQL" or "Find")."""
    core = re.sub(r"^\W+|\W+$", "", word)
    return any(c.isupper() for c in core[1:]) and any(c.islower() for c in core)


def _value_words(request: str) -> set[str]:
    """The request's words that look like values a call takes: quoted, or in a word with a digit, with a path's or
    an address's inner punctuation (/ @ : _ .), in mixed case ("arXiv"), or capitalised away from a sentence's start
    ("Paris", not "Find"; not "I" or "I'm")."""
    out = {w for m in _QUOTED.finditer(request) for w in _words([m.group(1) or m.group(2)])}
    prev = "."
    for chunk in request.split():
        core = chunk.strip("()[]{},;:!?\"'“”‘’`")
        if core and (any(ch.isdigit() for ch in core) or _INNER.search(core) or _mixed_case(core)
                     or (core[0].isupper() and prev[-1] not in ".?!" and re.split(r"['’]", core)[0] != "I")):
            out |= _words([core])
        prev = chunk
    return out


def request_values(request: str) -> int:
    """How many words of `request` look like values a call takes (`_value_words`), at most `VALUES_CAP` (1:
    whether it names one)."""
    return min(len(_value_words(request)), VALUES_CAP)


def values_left(request: str, earlier: list) -> bool:
    """Whether a value of `request` is left that no call in `earlier` took: a further call that takes none of the
    request's values could not act on a part of its own (`new_part`), so it is not decoded. A word of a called
    tool's name is no value left ("an Uber" after `uber.ride` took every value)."""
    from nexus_agent.arguments.copy_sources import name_words

    named = {w for c in earlier for w in name_words(c.name)}
    return bool(_value_words(request) - _taken(earlier) - named)


def new_part(args: dict | None, earlier: list, request: str) -> bool:
    """Whether `args` act on their own part of `request`: of the request's words they take, the ones no earlier
    call took are at least as many as the ones an earlier call took ("London" after "Paris" in the same unit;
    not "Tokyo" after "Asia/Tokyo", nor `git_show` "last 3 commits" in the repository `git_log` took with 3:
    a call that shares most of its words with one made is a step after it, made once its result is seen)."""
    asked = _words([request])
    taken = _taken(earlier) & asked
    mine = _words(_leaves(args or {})) & asked
    return bool(mine - taken) and len(mine - taken) >= len(mine & taken)
