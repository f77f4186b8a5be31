"""Example requests per tool: templated from the schema, given by users, or learned from confirmed calls.

A router that holds at scale matches a request against requests, not only against a description. At
registration every tool gets a few templated examples built from its schema fields alone (name, description,
parameter names and descriptions, enum values; no model, no data), deterministic so that they can be
cached and compared. Users add their own (`nexus tools examples add NAME "..."`, or an `examples` list in
a tool file) and confirmed calls add the request that led to them (source "learned").

The store keeps each example with the schema hash it was made for (a schema change drops them) and a
checksum over (tool, schema hash, source, text), so a damaged row is detected on read instead of being
routed on (registry.store.RegistryStore.examples).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

SOURCES = ("template", "user", "learned")
MAX_TEMPLATES = 4
MAX_EXAMPLE_CHARS = 300
_WORDS_CLAUSE = 14


@dataclass(frozen=True)
class Example:
    """One example request of a tool: its text, where it came from (SOURCES) and the schema hash it belongs to."""

    text: str
    source: str
    schema_hash: str

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"example source must be one of {SOURCES}, got {self.source!r}")


def normalize_example(text: str) -> str:
    """Whitespace collapsed and trimmed; ValueError for an empty or oversized example (> MAX_EXAMPLE_CHARS)."""
    if not isinstance(text, str):
        raise ValueError(f"an example request must be a string, got {type(text).__name__}")
    out = " ".join(text.split())
    if not out:
        raise ValueError("an example request must not be empty")
    if len(out) > MAX_EXAMPLE_CHARS:
        raise ValueError(f"an example request is {len(out)} characters, limit {MAX_EXAMPLE_CHARS}; shorten it")
    return out


def example_checksum(tool: str, schema_hash: str, source: str, text: str) -> str:
    """blake2b-128 hex over the four fields of a stored example (a flipped byte in any of them is caught)."""
    h = hashlib.blake2b(digest_size=16)
    for part in (tool, schema_hash, source, text):
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()


def _words(identifier: str) -> str:
    """`calc.final_velocity` / `getUserInfo` -> `calc final velocity` / `get user info` (lower case)."""
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", identifier)
    return re.sub(r"[._\-/]+", " ", s).strip().lower()


def _base_verb(word: str) -> str:
    """'Calculates' -> 'calculate', 'Retrieves' -> 'retrieve', 'Fetches' -> 'fetch' (third person to base)."""
    w = word.lower()
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith(("ches", "shes", "sses", "xes", "zes")):
        return w[:-2]
    if w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        return w[:-1]
    return w


def _clause(description: str, max_words: int = _WORDS_CLAUSE, verb: bool = True) -> str:
    """First sentence of the description as a request: leading article dropped, first word in base form (when
    `verb`), at most `max_words` words, no trailing punctuation."""
    text = " ".join((description or "").split())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    text = (m.group(1) if m else text).rstrip(".!? ")
    words = text.split(" ")[:max_words] if text else []
    if words and words[0].lower() in ("this", "the", "a", "an") and len(words) > 2:
        words = words[1:]  # "This tool calculates ..." -> "tool calculates ..."
        if words[0].lower() in ("tool", "function", "method", "api", "endpoint") and len(words) > 2:
            words = words[1:]
    if words and verb:
        words[0] = _base_verb(words[0])
    return " ".join(words).rstrip(",;:")


def _params(schema: dict) -> list[tuple[str, dict]]:
    """Top-level (name, property) pairs, required first, in declaration order."""
    props = (schema or {}).get("properties") or {}
    if not isinstance(props, dict):
        return []
    req = [r for r in (schema or {}).get("required") or [] if isinstance(r, str) and r in props]
    order = req + [p for p in props if p not in req]
    return [(p, props[p] if isinstance(props[p], dict) else {}) for p in order]


def template_examples(name: str, description: str, input_schema: dict, limit: int = MAX_TEMPLATES) -> list[str]:
    """Up to `limit` distinct example requests built from the schema fields only (see the module docstring):

    1. the description's first clause as a request ("calculate the area of a triangle given ...");
    2. the name's words with the required parameter names ("calculate triangle area with base and height");
    3. for the first parameter with enum values, the name's words with that parameter and its first value
       ("get weather unit celsius"), else the name's words with the first parameter's description;
    4. the first clause, shortened, with every parameter name ("calculate the area of a triangle: base, height").
    """
    verb_name = _words(name)
    clause = _clause(description)
    params = _params(input_schema)
    required = [p for p in (input_schema or {}).get("required") or [] if isinstance(p, str)]
    out: list[str] = []
    if clause:
        out.append(clause)
    req_words = [_words(p) for p, _ in params if p in required][:3]
    out.append(verb_name + (" with " + " and ".join(req_words) if req_words else ""))
    enum_param = next(((p, spec["enum"]) for p, spec in params
                       if isinstance(spec.get("enum"), list) and spec["enum"]), None)
    if enum_param is not None:
        out.append(f"{verb_name} {_words(enum_param[0])} {enum_param[1][0]}")
    elif params and isinstance(params[0][1].get("description"), str) and params[0][1]["description"].strip():
        out.append(f"{verb_name} for {_clause(params[0][1]['description'], 10, verb=False).lower()}")
    if clause and params:
        out.append(" ".join(clause.split(" ")[:8]).rstrip(",;:") + ": " + ", ".join(_words(p) for p, _ in params[:5]))
    distinct = dict.fromkeys(" ".join(t.split())[:MAX_EXAMPLE_CHARS] for t in out)
    return [t for t in distinct if t][:limit]
