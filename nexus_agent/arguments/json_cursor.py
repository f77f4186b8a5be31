"""Where an incrementally written JSON text is (the path and the bytes of the value being written), and the
subschema that governs that place: what a logits processor needs to act on values and not on keys."""

from __future__ import annotations

from typing import Iterable


class JsonCursor:
    """Where an incrementally written JSON text is: the path of the value being written and its bytes so far.

    `value_prefix()` is None outside a value (inside a key, between members), b"" where a value may start,
    else the value's bytes so far (a string with its opening quote). `path()` lists object keys and "[]"
    for array items, outermost first.
    """

    def __init__(self):
        self.stack: list[list] = []  # [kind "{" | "[", key, expect, keys written]; expect: key colon value comma
        self.root_done = False
        self.in_string = False
        self.string_is_key = False
        self.escape = False
        self.scalar = False
        self.buf = bytearray()
        self.values = 0  # values begun so far: tells one value from the next

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
                        self.stack[-1][3].append(self.stack[-1][1])
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
                self.stack.append(["{" if c == 0x7B else "[", None, "key" if c == 0x7B else "value", []])
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
                self.values += not self.string_is_key
                self.buf = bytearray()
            else:
                self.scalar = True
                self.values += 1
                self.buf = bytearray([c])

    def value_prefix(self) -> bytes | None:
        if self.in_string:
            return None if self.string_is_key else b'"' + bytes(self.buf)
        if self.scalar:
            return bytes(self.buf)
        return b"" if self._expecting_value() else None

    def key_prefix(self) -> bytes | None:
        """b"" where an object key may start, b'"' + its bytes so far inside a key, else None."""
        if self.in_string:
            return b'"' + bytes(self.buf) if self.string_is_key else None
        return b"" if self.stack and self.stack[-1][0] == "{" and self.stack[-1][2] == "key" else None

    def member_done(self) -> bool:
        """Whether an object member was just written (a `,` or the closing `}` comes next)."""
        return bool(self.stack) and self.stack[-1][0] == "{" and self.stack[-1][2] == "comma" and not self.in_string \
            and not self.scalar

    def keys_written(self) -> list[str]:
        """The keys of the innermost object written so far (the one being written included once closed)."""
        return list(self.stack[-1][3]) if self.stack and self.stack[-1][0] == "{" else []

    def between_items(self) -> bool:
        """Right after an array item: a comma (another item) or the closing bracket comes next."""
        return bool(self.stack) and self.stack[-1][0] == "[" and self.stack[-1][2] == "comma" and not self.scalar

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


def json_types(s: dict) -> set[str]:
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
            return set().union(*(json_types(a) for a in s[alt] if isinstance(a, dict))) or every
    return every
