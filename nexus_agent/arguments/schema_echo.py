"""A value never restates its own schema.

Shown a tool's JSON schema in its chat template's tools section, Qwen2.5-Coder-0.5B writes the schema where
the value goes, and the grammar allows it: `"insn": {"description": "The ConstructorInsn instance ..."}` for a
parameter whose schema gives no type, `"params": {"params": {"description": ..., "type": "object"}}` for an
object without declared properties, `"type": "array"` for a string parameter named `type` (the schema word of its
neighbour). `SchemaEcho` knows, for each value the decode reaches, the texts that would restate its subschema
(`echoes`): an object whose first member is one of the subschema's keywords with the subschema's own value (or
the parameter's name holding such an object), a string that is a JSON type name (one that neither the request nor
the description names) or the parameter's description, or one that opens with a quote of its own (after "in the
format of 'City, State', such as 'Los Angeles, CA'" the 0.5B wrote `"'Los Angeles, CA'"`, then quoted every value
after it: the quotes a description or a request puts around a value delimit it).

Where the likeliest token is the first to commit to one of them (`Echo.split`: `{"` is any object's, the keyword
after it is the echo's; where the schema leaves the type open, the `{` is already the echo's), it reads the
model's own continuation ahead (greedy, the passes removed again) and, when that writes the echo out, forbids
the token: the model takes its next choice (under the copy bias, a value from the request). Values whose type
admits none of these texts cost nothing; the others cost a look ahead only where the model starts an echo.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nexus_agent.arguments.constrained import copy_forces, token_bytes
from nexus_agent.arguments.json_cursor import JsonCursor, json_types, schema_at

KEYWORDS = ("description", "type", "title", "items", "properties", "enum", "default", "format", "anyOf", "oneOf")
TYPE_NAMES = ("string", "number", "integer", "boolean", "object", "array", "null")
ECHO_BYTES = 24  # how much of a keyword's value (or of the description) an echo is recognised by
QUOTED = (b'"\'', b'"`', b'"\\"')  # a string opening with a quote of its own: ', ` or an escaped "
MAX_AHEAD = 12  # tokens read ahead to confirm an echo
MAX_BANS = 4  # tokens forbidden per value at most: then the model's choice stands


@dataclass(frozen=True)
class Echo:
    """A text (compact JSON, `compact`) that would restate a subschema from a value's start; `split`: its bytes
    before that are any value's (`{"`, `"`), those after commit to the echo."""

    text: bytes
    split: int


def compact(b: bytes) -> bytes:
    """`b` (JSON, maybe partial) without the whitespace outside its strings."""
    out, in_str, esc = bytearray(), False, False
    for c in b:
        if in_str:
            out.append(c)
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c not in b" \t\r\n":
            out.append(c)
            in_str = c == 0x22
    return bytes(out)


def _dumped(v) -> bytes:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def echoes(sub: dict, name: str | None, named: str) -> list[Echo]:
    """The texts that would restate `sub` (the subschema of the value, `name` its parameter) from the value's
    start; `named`: the request's words (lower case): a type name it says is a value, not an echo."""
    if not isinstance(sub, dict):
        return []
    types = json_types(sub)
    out: list[Echo] = []
    if "object" in types and not sub.get("properties"):
        members = [b'"' + k.encode() + b'":' + _dumped(sub[k])[:ECHO_BYTES] for k in KEYWORDS if k in sub]
        split = 2 if types == {"object"} else 0  # a value of open type need not be an object at all
        out += [Echo(b"{" + m, split) for m in members]
        if name:
            out += [Echo(b'{"' + name.encode() + b'":{' + m, split) for m in members]
    if "string" in types and "enum" not in sub:
        said = set(re.findall(r"\w+", named))
        desc = sub.get("description")
        said |= set(re.findall(r"\w+", desc.lower())) if isinstance(desc, str) else set()  # values it lists
        if isinstance(sub.get("default"), str):
            said.add(sub["default"].lower())
        out += [Echo(b'"' + w.encode() + b'"', 1) for w in TYPE_NAMES if w not in said]
        out += [Echo(q, 1) for q in QUOTED]  # the quotes around a value delimit it: `'City, State'`
        if isinstance(desc, str) and len(desc) >= 8 and desc[:ECHO_BYTES].lower() not in named:
            out.append(Echo(_dumped(desc)[: ECHO_BYTES + 1], 1))
    return out


class SchemaEcho:
    """Logits processor (after `CopyBias`): forbid the token that begins writing a value's schema as the value
    (module docstring). `session`: the generation's session (bound to `generate_step`'s view), for the look
    ahead; `request`: the request's text, whose words may be values; `copies`: processors before it (a
    `CopyBias`) whose `forced` token, a copy, it leaves alone."""

    def __init__(self, tokenizer, schema: dict, session, request: str = "", copies: Sequence = ()):
        self.tb = token_bytes(tokenizer)
        self.copies = list(copies)  # processors before it whose `forced` token is a copy: never an echo
        self.schema = schema or {}
        self.session = session
        self.named = request.lower()
        self.cursor = JsonCursor()
        self.text = b""  # compact JSON written so far
        self.raw = b""
        self.seen = 0
        self.starts: dict[int, tuple[int, list[Echo]]] = {}  # depth -> (where its value starts, its echoes)
        self.bans = 0
        self.banned: list[str] = []  # the echoes refused, to read when a decode is looked into

    def bind(self, view) -> None:
        self.session = view

    def _feed(self, tokens: list[int]) -> None:
        for t in tokens[self.seen:]:
            self.cursor.feed(self.tb[t])
            self.raw += self.tb[t]
        self.seen = len(tokens)
        self.text = compact(self.raw)
        if self.cursor.value_prefix() == b"":
            depth = len(self.cursor.stack)
            path = self.cursor.path()
            if self.starts.get(depth, (None,))[0] != len(self.text):
                name = next((p for p in reversed(path) if p != "[]"), None)
                self.starts = {d: s for d, s in self.starts.items() if d < depth}
                self.starts[depth] = (len(self.text), echoes(schema_at(self.schema, path), name, self.named))
                self.bans = 0

    def _committing(self, t: int) -> list[tuple[int, Echo]]:
        """(value start, echo) of the echoes token `t` would begin committing to here."""
        out, whole = [], compact(self.raw + self.tb[t])
        for start, found in self.starts.values():
            before, after = self.text[start:], whole[start:]
            for e in found:
                if len(before) <= e.split < len(after) and (e.text.startswith(after) or after.startswith(e.text)):
                    out.append((start, e))
        return out

    def _writes(self, t: int, start: int, found: list[Echo]) -> Echo | None:
        """The echo the model's own continuation from token `t` writes out, if any (greedy; passes removed)."""
        n0, raw = self.session.n_past, self.raw + self.tb[t]
        try:
            for _ in range(MAX_AHEAD):
                written = compact(raw)[start:]
                alive = [e for e in found if e.text.startswith(written) or written.startswith(e.text)]
                done = next((e for e in alive if written.startswith(e.text)), None)
                if done is not None or not alive:
                    return done
                found = alive
                t = int(np.argmax(self.session.forward_logits([t])[-1]))
                raw += self.tb[t]
        finally:
            self.session.remove(n0, self.session.n_past)
        return None

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        self._feed(tokens)
        if self.bans >= MAX_BANS or not any(f for _, f in self.starts.values()):
            return logits
        out = logits
        while self.bans < MAX_BANS:
            t = int(np.argmax(out))
            if not np.isfinite(out[t]):
                return out
            if copy_forces(self.copies, t):
                return out  # a copy of the request's words restates nothing of the schema
            hits = self._committing(t)
            if not hits:
                return out
            start = hits[0][0]
            echo = self._writes(t, start, [e for s, e in hits if s == start])
            if echo is None or np.isfinite(out).sum() < 2:
                return out
            out = out.copy() if out is logits else out
            out[t] = -np.inf
            self.bans += 1
            self.banned.append(echo.text.decode("utf-8", "replace"))
        return out
