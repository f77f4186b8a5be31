"""Arguments decoded under a tool's JSON Schema with llguidance, over our own tokenizer, on any backend.

llguidance compiles the schema to a grammar and gives, at every step, the set of tokens that keep the output
a prefix of some schema-valid JSON document; we mask the logits with it (greedy by default) and feed the
chosen token to both the matcher and the backend session. The llguidance tokenizer is built from our token
list: byte-level BPE token strings mapped back to their bytes (the GPT-2 byte alphabet), special tokens as
their literal text, and our encoder for re-tokenising text.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from native.base import Session


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable stand-in character -> raw byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


class _TokenList:
    """The `gtokenizer` shape llguidance's TokenizerWrapper expects: tokens as bytes, ids of specials, encode."""

    def __init__(self, tokenizer):
        dec = _byte_decoder()
        self._tok = tokenizer
        self.tokens: list[bytes] = []
        for i in range(tokenizer.vocab_size):
            text = tokenizer.token_text(i)
            if i in tokenizer.special_ids or any(ch not in dec for ch in text):
                self.tokens.append(text.encode("utf-8"))
            else:
                self.tokens.append(bytes(dec[ch] for ch in text))
        self.special_token_ids = sorted(tokenizer.special_ids)
        self.eos_token_id = min(tokenizer.eos_ids)
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, s: str | bytes) -> list[int]:
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        return self._tok.encode(s)


@lru_cache(maxsize=4)
def _ll_tokenizer_cached(digest: str, tokenizer_ref: int):
    import llguidance

    tok = _REFS[tokenizer_ref]
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenList(tok)), eos_token=sorted(tok.eos_ids))


_REFS: dict[int, object] = {}


def ll_tokenizer(tokenizer):
    """The llguidance tokenizer for one of our tokenizers (built once per vocabulary digest)."""
    _REFS[id(tokenizer)] = tokenizer
    return _ll_tokenizer_cached(tokenizer.digest, id(tokenizer))


@dataclass
class ConstrainedResult:
    """What one constrained generation produced.

    text: the decoded JSON text; tokens: generated ids (stop token excluded); complete: the grammar reached
    an accepting state (False: token limit hit, the JSON is cut); ttft_s: seconds from the call to the first
    generated token (prefill included); error: llguidance's message when the matcher failed.
    """

    text: str
    tokens: list[int] = field(default_factory=list)
    complete: bool = False
    ttft_s: float = 0.0
    total_s: float = 0.0
    error: str | None = None

    def parse(self):
        return json.loads(self.text)


def closed_schema(schema):
    """`schema` with `additionalProperties: false` on every object that lists properties and does not say
    otherwise: a tool call should not invent keys, and a small model otherwise keeps adding them."""
    if isinstance(schema, list):
        return [closed_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_schema(v) if isinstance(v, (dict, list)) and k != "enum" and k != "const" else v
           for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: closed_schema(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def schema_grammar(schema: dict) -> str:
    """The llguidance grammar for an input schema: closed objects (`closed_schema`), compact JSON (no free
    whitespace), unknown keywords ignored (the result is still checked with jsonschema)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(
        closed_schema(schema), defaults={"whitespace_flexible": False, "lenient": True})


def _allowed(matcher, vocab: int) -> np.ndarray:
    """(vocab,) bool mask of tokens the grammar allows next."""
    bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[:vocab].astype(bool)


MAX_FRACTION_DIGITS = 6
MAX_INTEGER_DIGITS = 12
_FRACTION = re.compile(r"\d\.(\d+)$")
_INTEGER = re.compile(r"(?<![\d.])(\d+)$")


@lru_cache(maxsize=4)
def _digit_tokens(digest: str, tokenizer_ref: int) -> np.ndarray:
    tok = _REFS[tokenizer_ref]
    return np.array([tok.decode([i]).isdigit() for i in range(tok.vocab_size)], dtype=bool)


def _number_too_long(text: str) -> bool:
    """Whether the JSON text ends inside a number with as many digits as we let a small model write (greedy
    decoding of a 135M model otherwise runs `7.000000…` to the token limit; the grammar allows both)."""
    m = _FRACTION.search(text)
    if m:
        return len(m.group(1)) >= MAX_FRACTION_DIGITS
    m = _INTEGER.search(text)
    return bool(m) and len(m.group(1)) >= MAX_INTEGER_DIGITS


def _cycle_token(out: list[int]) -> int | None:
    """The token that would extend a loop at the end of `out` (a period of 2-4 tokens seen 3 times, or one
    token seen 6 times), or None. Greedy decoding of a small model loops inside strings (`1.1.1.1…`)."""
    for p, times in ((1, 6), (2, 3), (3, 3), (4, 3)):
        if len(out) >= p * times and all(out[-p * k - p: len(out) - p * k] == out[-p:] for k in range(1, times)):
            return out[-p]
    return None


def generate_json(session: Session, prompt: Sequence[int], schema: dict, tokenizer, max_tokens: int = 160,
                  on_token: Callable[[str], None] | None = None, logits=None) -> ConstrainedResult:
    """Prefill `prompt` (skip when `logits` (vocab,) after it are given), then decode greedily under `schema`.

    `on_token(piece)` streams the text as it grows. The session keeps every token it decoded.
    """
    import llguidance

    t0 = time.perf_counter()
    ll = ll_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(ll, schema_grammar(schema), log_level=0)
    if matcher.is_error():
        return ConstrainedResult("", error=f"schema not supported by llguidance: {matcher.get_error()}")
    if logits is None:
        logits = session.prefill(list(prompt))
    vocab = len(logits)
    out: list[int] = []
    ttft = None
    shown = ""
    eos = tokenizer.eos_ids
    _REFS[id(tokenizer)] = tokenizer
    digits = np.zeros(vocab, dtype=bool)
    d = _digit_tokens(tokenizer.digest, id(tokenizer))
    digits[: min(vocab, len(d))] = d[:vocab]
    for _ in range(max_tokens):
        mask = _allowed(matcher, vocab)
        if out and _number_too_long(shown_all := tokenizer.decode(out)) and shown_all[-1].isdigit():
            shorter = mask & ~digits[: len(mask)]
            if shorter.any():  # only narrow the grammar's own set: the output stays schema-valid
                mask = shorter
        loop = _cycle_token(out)
        if loop is not None and mask[loop] and mask.sum() > 1:
            mask[loop] = False  # break the loop with the grammar's next-best token
        if not mask.any():
            break
        masked = np.where(mask, logits, -np.inf)
        token = int(np.argmax(masked))
        if ttft is None:
            ttft = time.perf_counter() - t0
        if not matcher.consume_token(token):
            return ConstrainedResult(tokenizer.decode(out), out, False, ttft, time.perf_counter() - t0,
                                     matcher.get_error() or f"token {token} rejected")
        if token in eos:
            break
        out.append(token)
        text = tokenizer.decode(out)
        if on_token and not text.endswith("\ufffd"):
            on_token(text[len(shown):])
            shown = text
        if matcher.is_stopped():
            break
        logits = session.decode(token)
    text = tokenizer.decode(out)
    return ConstrainedResult(text, out, matcher.is_accepting() or matcher.is_stopped(), ttft or 0.0,
                             time.perf_counter() - t0, matcher.get_error() if matcher.is_error() else None)
