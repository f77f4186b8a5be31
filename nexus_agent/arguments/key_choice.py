"""Which optional keys an argument object gets, and where it closes: read from the request.

The grammar writes an object's keys in the schema's order and lets the model skip any optional one. A small
model skips the main one, or adds one the request says nothing about (`"tag": "notes"` for "Search my notes
for music"). `KeyChoice` tilts that choice for `CopyBias`: in an empty object toward its first key (an API
puts its main parameter first), and never past the first key the request names or requires (the keys come in the
schema's order, so a first key past it loses it: the 0.5B Qwen opened BFCL's movie searches with `cast`, 4-5
logits above the rest, and wrote the director into it); later toward the first key left that is required or that
the request names (`named`); with none such and no value of the request left untaken (`leftover`), toward
closing the object.
A value's closer often carries the comma (`",`): the choice to go on is then made there (`closer_tilt`).

Once no value of the request is left untaken, the tilts become rules: the next key is one the request names
(or a required one), and with none left the object closes. A key the request neither names nor gives a value
for is what a small model invents (`"sub_district_name": "1"`), and each costs a dozen tokens.
"""

from __future__ import annotations

import re

import numpy as np

from nexus_agent.arguments.copy_sources import MAX_TOKEN_BYTES, NUMBER, _escaped, enum_named, name_words, names_word
from nexus_agent.arguments.json_cursor import JsonCursor, json_types, schema_at
from nexus_agent.arguments.span_priors import JOINER_TEXT, taken

KEY_BIAS = 2.0  # logits on the tokens of the key chosen next
RULE = 1e4  # logits: where nothing of the request is left to write, the key chosen or the close is a rule


class KeyChoice:
    """The key-choice tilt for the object `cursor` is writing under `schema`.

    `request` is the request's text, lower case; `texts` the escaped sources as (bytes, kind); `used` the
    copies made so far (shared with `CopyBias`, which appends to it); `index` maps token bytes to token ids;
    `close_obj` and `comma` mark the tokens that close an object and that hold a comma; `bias` is the copy
    bias, used for the tilt toward closing.
    """

    def __init__(self, schema: dict, cursor: JsonCursor, request: str, texts: list[tuple[bytes, str]],
                 used: list[tuple[int, int, int]], index: dict[bytes, list[int]], close_obj: np.ndarray,
                 comma: np.ndarray, bias: float):
        self.schema, self.cursor, self.request, self.texts, self.used = schema, cursor, request, texts, used
        self.index, self.close_obj, self.comma, self.bias = index, close_obj, comma, bias
        self.request_words = [w for w in re.split(r"[\s/-]+", request)  # "four-star" names star_rating
                              if w and w.strip(",.;:?!'\"()") not in JOINER_TEXT]

    def named(self, key: str, sub: dict) -> bool:
        """Whether the request gives evidence for parameter `key`: a word of it names the key (`names_word`),
        or it names one of the key's enum values."""
        words = name_words(key)
        return any(names_word(w, words) for w in self.request_words) or bool(enum_named(sub, self.request))

    def wanted(self, obj: dict, remaining: list[str]) -> list[str]:
        """The keys of `remaining` that are required or that the request names, in schema order."""
        props, required = obj.get("properties") or {}, set(obj.get("required") or [])
        return [k for k in remaining
                if k in required or self.named(k, props[k] if isinstance(props[k], dict) else {})]

    def after(self, props: dict) -> list[str]:
        """The keys of `props` that may still be written: those after the last one written (the grammar writes
        keys in the schema's order)."""
        keys, written = list(props), self.cursor.keys_written()
        last = max((keys.index(k) for k in written if k in props), default=-1)
        return keys[last + 1:]

    def left(self, want) -> list[str]:
        """The keys of the object being written that may still be written whose JSON types satisfy
        `want(types)`."""
        path = self.cursor.path()
        props = schema_at(self.schema, path[:-1]).get("properties") if path and path[-1] != "[]" else None
        if not isinstance(props, dict):
            return []
        return [k for k in self.after(props) if want(json_types(props[k] if isinstance(props[k], dict) else {}))]

    def leftover(self) -> bool:
        """Whether the request still holds a value no copy has taken that a key left could take: a number (for
        a numeric key), a quoted text or a capitalized word that does not start a sentence (for a string
        key: "maybe something with *Jim Carrey* in it"). Then the model decides whether another key takes it."""
        numeric = bool(self.left(lambda t: t & {"number", "integer"}))
        strings = bool(self.left(lambda t: "string" in t))
        for k, (text, kind) in enumerate(self.texts):
            if kind != "request":
                continue
            spots = [m.start() for m in NUMBER.finditer(text)] if numeric else []
            if strings:
                spots += [m.end() - 1 for m in re.finditer(rb"""(?:^|\s)['"`]\S""", text)]  # a quoted text
                spots += [m.end() - 1 for m in re.finditer(rb"[^.?!\s]\s+[A-Z]", text)]
            if any(not taken(self.used, k, p) for p in spots):
                return True
        return False

    def ends_object(self) -> bool:
        """Whether the value being written is the object's last: no key left that is required or named by
        the request, and no value left in the request (`leftover`)."""
        path = self.cursor.path()
        if not path or path[-1] == "[]":
            return False
        obj = schema_at(self.schema, path[:-1])
        props = obj.get("properties")
        if not isinstance(props, dict):
            return False
        return not self.wanted(obj, self.after(props)) and not self.leftover()

    def closer_tilt(self, out: np.ndarray, closers: np.ndarray, tilt: bool = True) -> np.ndarray:
        """When `ends_object`: +bias (the request's evidence against one more key; not with `tilt` False, for a
        value the model writes itself, which may go on) on the value closers without a comma, and the closers
        with one ruled out: a `"}` closer is then preferred to `",`, and the value may still go on."""
        if self.ends_object():
            n = min(len(out), len(closers))
            if tilt:
                out[:n] = np.where(closers[:n] & ~self.comma[:n], out[:n] + self.bias, out[:n])
            out[:n] = np.where(closers[:n] & self.comma[:n], out[:n] - RULE, out[:n])
        return out

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """At an object key with a choice, +KEY_BIAS on the tokens of the key chosen (module docstring), or
        the object's closers when nothing the request asks for is left; both as rules (`RULE`) once the
        request has no value left untaken."""
        kp = b"" if self.cursor.member_done() else self.cursor.key_prefix()
        if kp is None:
            return logits
        obj = schema_at(self.schema, self.cursor.path()[:-1])
        props = obj.get("properties")
        if not isinstance(props, dict):
            return logits
        written = self.cursor.keys_written()
        remaining = self.after(props)
        if not remaining:
            return logits
        wanted = self.wanted(obj, remaining)
        target = remaining[0] if not written else wanted[0] if wanted else None
        boost = np.zeros(len(logits), dtype=bool)
        if self.cursor.member_done() and target is not None:
            return logits  # a `,` and then that key: tilted when its key starts
        if target is None:  # nothing the request asks for is left: close
            if kp or self.leftover():
                return logits
            n = min(len(logits), len(self.close_obj))
            boost[:n] = self.close_obj[:n]
            return np.where(boost, logits + RULE, logits)
        self._spell(boost, target, kp, len(logits))
        out = np.where(boost, logits + (KEY_BIAS if not written or self.leftover() else RULE), logits)
        if not written and wanted:  # the first key: none past the first key wanted, wherever the key has got to
            allowed = np.zeros(len(logits), dtype=bool)
            for k in remaining[: remaining.index(wanted[0]) + 1]:
                self._spell(allowed, k, kp, len(logits))
            out = np.where(allowed, out + RULE, out)
        return out

    def _spell(self, mask: np.ndarray, key: str, kp: bytes, n: int) -> None:
        """Mark in `mask` the tokens that go on writing `key` (with its `": `) after the key prefix `kp`."""
        full = b'"' + _escaped(key) + b'": '
        if not full.startswith(kp) or len(full) == len(kp):
            return
        rest = full[len(kp):]
        for m in range(1, min(MAX_TOKEN_BYTES, len(rest)) + 1):
            mask[[i for i in self.index.get(rest[:m], ()) if i < n]] = True
