"""Copy-aware argument decoding: a logits bias toward values copied from the request or an earlier result.

Most argument values a request needs are written in it ("Read the file notes/plan.md", "Add 837 and 12") or
in an earlier tool result of the same turn ("... then multiply the result by 3"). A 135M model under a
grammar still invents them (`./data.csv`, `100`); it copies reliably once copying is the likely move.

`CopyBias` is a logits processor for `generate_step`. It follows the JSON being generated (`JsonCursor`) and,
while a value is being written, adds `bias` to every token that continues a *copy*: the value so far followed
by that token is a prefix of a span of a source text (a string value starting at a word boundary, any end),
of a number written in a source (for number/integer parameters), or of an enum value the request names. A
token that closes the value right after a complete copy (the closing quote, a `,` after a number) gets the
same bias, so a copy that could go on competes with stopping by the model's own likelihood: the bias only
tilts the choice between copying and inventing, it never decides which span or where it ends. The grammar
mask runs after this processor, so a value the schema forbids stays impossible (enums, types, bounds).

`value_sources` says afterwards where each argument value came from: `request`, `observation`, `enum`,
`default` or `generated`; the agent's trace records it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from nexus_agent.constrained import _REFS, token_bytes

DEFAULT_BIAS = 4.0  # logits; chosen on the agent suite and BFCL by `nexus eval arguments --bias` (README)
MAX_TOKEN_BYTES = 24
_NUMBER = re.compile(rb"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\w|\.\d)")
_STRING_CLOSERS = set(b'",}] \n')
_NUMBER_CLOSERS = set(b",}] \n")


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


def _word_starts(b: bytes) -> list[int]:
    """Positions where a copied string may start: the start of each space-separated word, and its first
    letter or digit when punctuation leads (`(490`, `'buy`). Not inside a word: a path is copied whole
    (`/tmp/x/repo`, never `x/repo`), though it may end early."""
    out = []
    for i, c in enumerate(b):
        if c in b" \t\n":
            continue
        if i == 0 or b[i - 1] in b" \t\n":
            out.append(i)
        elif _is_word(c) and not any(_is_word(x) for x in b[_word_start(b, i): i]):
            out.append(i)
    return out


def _word_start(b: bytes, i: int) -> int:
    while i > 0 and b[i - 1] not in b" \t\n":
        i -= 1
    return i


def _word_end(b: bytes, i: int) -> bool:
    """Whether a copy may end before byte `i`: at the end, or not inside an alphanumeric run."""
    return i >= len(b) or not (_is_word(b[i]) and _is_word(b[i - 1]))


def numbers_in(text: str) -> list[bytes]:
    """The numbers written in `text` as JSON number literals (thousands separators dropped), in order."""
    out = []
    for m in _NUMBER.finditer(text.encode("utf-8")):
        lit = m.group(0).replace(b",", b"")
        if lit not in out:
            out.append(lit)
    return out


@lru_cache(maxsize=4)
def _bytes_index_cached(digest: str, tokenizer_ref: int) -> tuple[dict[bytes, list[int]], np.ndarray, np.ndarray]:
    tb = token_bytes(_REFS[tokenizer_ref])
    index: dict[bytes, list[int]] = {}
    close_str = np.zeros(len(tb), dtype=bool)
    close_num = np.zeros(len(tb), dtype=bool)
    for i, b in enumerate(tb):
        if 0 < len(b) <= MAX_TOKEN_BYTES:
            index.setdefault(b, []).append(i)
        if b[:1] == b'"' and all(c in _STRING_CLOSERS for c in b[1:]):
            close_str[i] = True
        if b and all(c in _NUMBER_CLOSERS for c in b) and b[0] in b",}]":
            close_num[i] = True
    return index, close_str, close_num


class JsonCursor:
    """Where an incrementally written JSON text is: the path of the value being written and its bytes so far.

    `value_prefix()` is None outside a value (inside a key, between members), b"" where a value may start,
    else the value's bytes so far (a string with its opening quote). `path()` lists object keys and "[]"
    for array items, outermost first.
    """

    def __init__(self):
        self.stack: list[list] = []  # [kind "{" | "[", key, expect]; expect: key colon value comma
        self.root_done = False
        self.in_string = False
        self.string_is_key = False
        self.escape = False
        self.scalar = False
        self.buf = bytearray()

    def _expecting_value(self) -> bool:
        return self.stack[-1][2] == "value" if self.stack else not self.root_done

    def _after_value(self) -> None:
        if self.stack:
            self.stack[-1][2] = "comma"
        else:
            self.root_done = True

    def feed(self, data: bytes) -> None:
        for c in data:
            if self.in_string:
                if self.escape:
                    self.escape = False
                    self.buf.append(c)
                elif c == 0x5C:  # backslash
                    self.escape = True
                    self.buf.append(c)
                elif c == 0x22:  # closing quote
                    self.in_string = False
                    if self.string_is_key:
                        self.stack[-1][1] = bytes(self.buf).decode("utf-8", "replace")
                        self.stack[-1][2] = "colon"
                    else:
                        self._after_value()
                    self.buf = bytearray()
                else:
                    self.buf.append(c)
                continue
            if self.scalar:
                if chr(c).isalnum() or c in b"+-.":
                    self.buf.append(c)
                    continue
                self.scalar = False
                self.buf = bytearray()
                self._after_value()
            if c in b" \t\r\n":
                continue
            if c in b"{[":
                self.stack.append(["{" if c == 0x7B else "[", None, "key" if c == 0x7B else "value"])
            elif c in b"}]":
                if self.stack:
                    self.stack.pop()
                self._after_value()
            elif c == 0x3A:  # colon
                if self.stack:
                    self.stack[-1][2] = "value"
            elif c == 0x2C:  # comma
                if self.stack:
                    self.stack[-1][2] = "key" if self.stack[-1][0] == "{" else "value"
            elif c == 0x22:
                self.in_string = True
                self.string_is_key = bool(self.stack) and self.stack[-1][0] == "{" and self.stack[-1][2] == "key"
                self.buf = bytearray()
            else:
                self.scalar = True
                self.buf = bytearray([c])

    def value_prefix(self) -> bytes | None:
        if self.in_string:
            return None if self.string_is_key else b'"' + bytes(self.buf)
        if self.scalar:
            return bytes(self.buf)
        return b"" if self._expecting_value() else None

    def path(self) -> tuple[str, ...]:
        return tuple(f[1] if f[0] == "{" else "[]" for f in self.stack)


def schema_at(schema: dict, path: Iterable[str]) -> dict:
    """The subschema at `path` (object keys, "[]" for items); {} (anything) where it cannot be told."""
    s = schema if isinstance(schema, dict) else {}
    for key in path:
        for alt in ("anyOf", "oneOf", "allOf"):
            if alt in s and isinstance(s[alt], list):
                s = next((a for a in s[alt] if isinstance(a, dict) and ("properties" in a or "items" in a)), s)
        if key == "[]":
            s = s.get("items") if isinstance(s.get("items"), dict) else {}
        else:
            s = (s.get("properties") or {}).get(key) if isinstance(s.get("properties"), dict) else {}
            s = s if isinstance(s, dict) else {}
    return s


def _types(s: dict) -> set[str]:
    """The JSON types a subschema admits ({"string", "number", ...}; every type when it does not say)."""
    every = {"string", "number", "integer", "boolean", "object", "array", "null"}
    if "enum" in s and isinstance(s["enum"], list):
        return {"string" if isinstance(v, str) else "number" for v in s["enum"] if not isinstance(v, bool)}
    t = s.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return set(t)
    for alt in ("anyOf", "oneOf"):
        if isinstance(s.get(alt), list):
            return set().union(*(_types(a) for a in s[alt] if isinstance(a, dict))) or every
    return every


class CopyBias:
    """Logits processor: add `bias` to tokens that continue copying a value from `sources` (module docstring).

    One instance serves one generation (it follows that generation's JSON).
    """

    def __init__(self, tokenizer, sources: list[Source], schema: dict, bias: float = DEFAULT_BIAS):
        _REFS[id(tokenizer)] = tokenizer
        self.tb = token_bytes(tokenizer)
        self.index, self.close_str, self.close_num = _bytes_index_cached(tokenizer.digest, id(tokenizer))
        self.schema, self.bias = schema or {}, bias
        self.cursor = JsonCursor()
        self.seen = 0
        self.texts = [(_escaped(s.text), s.kind) for s in sources if s.text]
        self.starts = [_word_starts(b) for b, _ in self.texts]
        self.numbers = [n for s in sources for n in numbers_in(s.text)]
        self.request = " ".join(s.text for s in sources if s.kind == "request").lower()
        self.boosted = 0  # steps at which some token was boosted (for the trace)

    def _enum_copies(self, sub: dict) -> list[bytes]:
        """Enum strings the request names (case-insensitive, as a word): copies for an enum parameter."""
        vals = [v for v in sub.get("enum") or [] if isinstance(v, str) and v]
        return [_escaped(v) for v in vals if re.search(rf"(?<!\w){re.escape(v.lower())}(?!\w)", self.request)]

    def candidates(self, prefix: bytes, sub: dict) -> tuple[set[int], bool]:
        """(token ids that continue a copy of the value `prefix`, whether closing the value now ends one)."""
        types = _types(sub)
        ids: set[int] = set()
        closes = False

        def extend(remaining: bytes) -> None:
            for n in range(1, min(MAX_TOKEN_BYTES, len(remaining)) + 1):
                ids.update(self.index.get(remaining[:n], ()))

        if "string" in types and prefix[:1] in (b"", b'"'):
            content = prefix[1:]
            for b in self._enum_copies(sub):
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
            for lit in self.numbers:
                if "number" not in types and b"." in lit:
                    continue
                if lit.startswith(prefix):
                    rest = lit[len(prefix):]
                    extend(rest)
                    closes |= bool(prefix) and not rest
        return ids, closes

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        for t in tokens[self.seen:]:
            self.cursor.feed(self.tb[t])
        self.seen = len(tokens)
        prefix = self.cursor.value_prefix()
        if prefix is None or self.bias == 0:
            return logits
        sub = schema_at(self.schema, self.cursor.path())
        ids, closes = self.candidates(prefix, sub)
        if not ids and not closes:
            return logits
        boost = np.zeros(len(logits), dtype=bool)
        if ids:
            boost[[i for i in ids if i < len(logits)]] = True
        if closes:
            closers = self.close_str if prefix[:1] == b'"' else self.close_num
            boost[: len(closers)] |= closers[: len(logits)]
        self.boosted += 1
        return np.where(boost, logits + self.bias, logits)


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
