"""What an argument value may be copied from, and where each value came from.

A `Source` is a text a value may be copied from: the step's own words ("request") or an earlier result of the
same turn ("observation"). Copies start at a word (`_word_starts`) and end where a word ends (`_word_end`);
numbers are read as JSON literals (`numbers_in`). `value_sources` says afterwards where each argument value
came from: `request`, `observation`, `enum`, `default` or `generated`; the agent's trace records it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from nexus_agent.arguments.json_cursor import schema_at

MAX_TOKEN_BYTES = 24  # the longest token (in bytes) the copy tables index
NUMBER = re.compile(rb"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w|\.\d)")


@dataclass(frozen=True)
class Source:
    """A text values may be copied from: kind "request" (the step's own words) or "observation" (an earlier
    call of the same turn and its result); `label` says which (e.g. the tool name)."""

    kind: str
    text: str
    label: str = ""


def _escaped(text: str) -> bytes:
    """`text` as the bytes it has inside a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


def _is_word(c: int) -> bool:
    return chr(c).isalnum() or c >= 128  # a UTF-8 byte of a non-ASCII character counts as a letter


_OPENERS = b"'\"([{<`"


def _word_starts(b: bytes) -> list[int]:
    """Positions where a copied string may start: the start of each space-separated word, and the byte after
    its opening quotes or brackets (`(490`, `'buy`, `\\"x`). Never inside a word: a path is copied whole
    (`/tmp/x/repo`, not `tmp/x/repo` or `x/repo`), though it may end early."""
    out = []
    for i, c in enumerate(b):
        if c in b" \t\n":
            continue
        j = i
        while j > 0 and (b[j - 1] in _OPENERS or b[j - 1] == 0x5C):  # escaped quotes count as openers
            j -= 1
        if j == 0 or b[j - 1] in b" \t\n":
            if i == j or c not in _OPENERS + b"\\":
                out.append(i)
    return out


_TRAILING = b",.;:?!)]}'\"`"


def _word_end(b: bytes, i: int) -> bool:
    """Whether a copy may end before byte `i`: where its space-separated word ends, or before the word's
    trailing punctuation (`data.csv,`, `2023-07-04?`). Never inside a word: `/tmp/work/repo` is not cut to
    `/tmp/work`."""
    j = i
    while j < len(b) and b[j] in _TRAILING:
        j += 1
    return i > 0 and (j >= len(b) or b[j] in b" \t\n\\")


def name_words(name: str) -> list[str]:
    """A parameter name's words, lower case, 2+ letters: `repo_path` -> [repo, path], `noteId` -> [note, id]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z]+", spaced.lower()) if len(w) >= 2]


def names_word(word: str, names: list[str]) -> bool:
    """Whether a request word names one of `names` (`name_words`): they share a stem, a common prefix of at
    least 4 letters or of the whole shorter word (`titled` ~ title, `stars` ~ starring, `tags` ~ tag); a word
    or name under 3 letters only by being equal."""
    w = re.sub(r"[^a-z]", "", word.lower())
    for n in names:
        if len(w) < 3 or len(n) < 3:  # a short word names only itself (`ID` ~ id)
            if w == n and len(w) >= 2:
                return True
            continue
        if len(os.path.commonprefix([w, n])) >= min(4, len(w), len(n)):
            return True
    return False


def enum_named(sub: dict, request: str) -> list[bytes]:
    """The enum strings of schema `sub` that `request` (lower case) names as a word, escaped: the copies an
    enum parameter may take."""
    vals = [v for v in sub.get("enum") or [] if isinstance(v, str) and v]
    return [_escaped(v) for v in vals if re.search(rf"(?<!\w){re.escape(v.lower())}(?!\w)", request)]


def numbers_in(text: str) -> list[bytes]:
    """The numbers written in `text` as JSON number literals (thousands separators dropped), in order."""
    out = []
    for m in NUMBER.finditer(text.encode("utf-8")):
        lit = m.group(0).replace(b",", b"")
        if lit not in out:
            out.append(lit)
    return out


def _leaves(value: Any, path: str = ""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}/{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def value_sources(arguments: dict | None, sources: list[Source], schema: dict) -> dict[str, str]:
    """Where each leaf value of `arguments` came from: "request" or "observation" (written there: a string as a
    substring, a number as a number), "enum" (an enum value the request does not spell), "default" (the
    schema default) or "generated". Keys are paths like `a`, `note/title`, `tags[0]`."""
    if not arguments:
        return {}
    out = {}
    for path, v in _leaves(arguments):
        keys = [k for k in re.split(r"/|\[\d+\]", path) if k]
        sub = schema_at(schema, [k if not k.isdigit() else "[]" for k in keys])
        out[path] = "generated"
        for s in sources:
            if isinstance(v, str) and v and v in s.text:
                out[path] = s.kind
                break
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if any(float(n) == v for n in numbers_in(s.text)):
                    out[path] = s.kind
                    break
        if out[path] == "generated":
            if "default" in sub and sub["default"] == v:
                out[path] = "default"
            elif v in (sub.get("enum") or []):
                out[path] = "enum"
    return out
