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


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _token_bytes(tokenizer) -> list[bytes]:
    """Every token id's bytes: byte-level BPE strings through the GPT-2 alphabet, SentencePiece pieces with
    `▁` as a space and `<0xNN>` byte-fallback pieces as their byte, special tokens as their literal text."""
    dec = _byte_decoder()
    sentencepiece = any("\u2581" in tokenizer.token_text(i) for i in tokenizer.encode("a b c"))
    out: list[bytes] = []
    for i in range(tokenizer.vocab_size):
        text = tokenizer.token_text(i)
        if i in tokenizer.special_ids:
            out.append(text.encode("utf-8"))
        elif sentencepiece:
            m = _BYTE_PIECE.fullmatch(text)
            out.append(bytes([int(m.group(1), 16)]) if m else text.replace("\u2581", " ").encode("utf-8"))
        elif all(ch in dec for ch in text):
            out.append(bytes(dec[ch] for ch in text))
        else:
            out.append(text.encode("utf-8"))
    return out


@lru_cache(maxsize=4)
def _token_bytes_cached(digest: str, tokenizer_ref: int) -> tuple[bytes, ...]:
    return tuple(_token_bytes(_REFS[tokenizer_ref]))


def token_bytes(tokenizer) -> tuple[bytes, ...]:
    """`_token_bytes`, computed once per vocabulary."""
    _REFS[id(tokenizer)] = tokenizer
    return _token_bytes_cached(tokenizer.digest, id(tokenizer))


class _TokenList:
    """The `gtokenizer` shape llguidance's TokenizerWrapper expects: tokens as bytes, ids of specials, encode."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.tokens: list[bytes] = list(token_bytes(tokenizer))
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
    decoded: int = 0  # generated tokens the session now holds (the last one is usually not decoded)
    extended: bool = False  # the decode went past `max_tokens` into its larger budget

    @property
    def cut(self) -> bool:
        """The token limit ended the document before the grammar accepted it."""
        return not self.complete and self.error is None

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


@lru_cache(maxsize=4096)
def _enforces(schema_json: str) -> bool:
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        closed_schema(json.loads(schema_json)), defaults={"whitespace_flexible": False, "lenient": False})
    return not llguidance.LLMatcher.validate_grammar(grammar)


def grammar_enforces(schema: dict) -> bool:
    """Whether the grammar enforces every keyword of `schema` (llguidance compiles it strictly: no keyword
    ignored, nothing unsatisfiable). Then a document the grammar accepts is valid under the schema, and the only
    way a constrained decode fails is the token limit (2,051 of the 2,052 public catalogue schemas)."""
    return _enforces(json.dumps(schema, sort_keys=True))


MAX_FRACTION_DIGITS = 6
MAX_INTEGER_DIGITS = 12
_FRACTION = re.compile(r"\d\.(\d+)$")
_INTEGER = re.compile(r"(?<![\d.])(\d+)$")


@lru_cache(maxsize=4)
def _digit_tokens(digest: str, tokenizer_ref: int) -> np.ndarray:
    tok = _REFS[tokenizer_ref]
    return np.array([tok.decode([i]).isdigit() for i in range(tok.vocab_size)], dtype=bool)


@lru_cache(maxsize=4)
def _closer_tokens(digest: str, tokenizer_ref: int) -> np.ndarray:
    """Tokens made only of JSON closers (`"`, `]`, `}`) and whitespace, with at least one closer."""
    tb = token_bytes(_REFS[tokenizer_ref])
    return np.array([bool(b.strip(b" \n\t")) and not b.strip(b' \n\t"]}') for b in tb], dtype=bool)


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


class GrammarMask:
    """Logits processor: forbid every token that cannot continue a document of the grammar (llguidance).

    The matcher consumes the tokens it has not seen at each call; `finished(tokens)` tells `generate_step`
    that the grammar accepts nothing more (the token just produced closed the document). `close(tokens)`
    consumes the final token after the stream ends, so `complete` and `error` describe the whole output.
    """

    def __init__(self, tokenizer, grammar: str):
        import llguidance

        self.matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer), grammar, log_level=0)
        self.seen = 0
        self.error: str | None = self.matcher.get_error() if self.matcher.is_error() else None

    def _consume(self, tokens: list[int]) -> bool:
        for t in tokens[self.seen:]:
            self.seen += 1
            if not self.matcher.consume_token(t):
                self.error = self.error or self.matcher.get_error() or f"token {t} rejected"
                return False
        return True

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        if not self._consume(tokens):
            return np.full_like(logits, -np.inf)
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: len(logits)].astype(bool)
        return np.where(allowed, logits, -np.inf)

    def finished(self, tokens: list[int]) -> bool:
        return self._consume(tokens) and self.matcher.is_stopped()

    def ahead(self, tokens: list[int]) -> list[int]:
        """The tokens the grammar forces after `tokens` (a property name once its first tokens tell it apart, the
        `":` after it): `generate_step` feeds them in one forward pass instead of one decode each, and still
        samples each from its own logits, so the text is the one decoded token by token."""
        if not self._consume(tokens) or self.matcher.is_stopped():
            return []
        return list(self.matcher.compute_ff_tokens())

    def close(self, tokens: list[int]) -> None:
        self._consume(tokens)

    @property
    def complete(self) -> bool:
        return self.error is None and (self.matcher.is_accepting() or self.matcher.is_stopped())


def copy_forces(copies: Sequence, token: int) -> bool:
    """Whether one of the processors `copies` (e.g. a `CopyBias`) forced `token` at this step as part of a copy
    (its `forced` attribute): a copied token repeats what its source writes, so no guard refuses it."""
    return any(getattr(p, "forced", None) == token for p in copies)


class LoopGuard:
    """Logits processor (after the grammar): break the loops and runaway numbers of greedy small-model
    decoding. It only ever removes a token the grammar allowed when another allowed one remains, so the
    output stays grammar-valid. Given `max_tokens`, the last `reserve` tokens prefer closers (`"`, `]`, `}`)
    wherever the grammar allows one, so a long array or string is closed before the limit cuts the JSON. A token
    that one of `copies` (processors before it, e.g. a `CopyBias`) names as its `forced` copy token is never taken
    for a loop: a copied value repeats only what its source writes."""

    def __init__(self, tokenizer, max_tokens: int | None = None, reserve: int = 12, copies: Sequence = ()):
        _REFS[id(tokenizer)] = tokenizer
        self.copies = list(copies)
        self.tokenizer = tokenizer
        self.digits = _digit_tokens(tokenizer.digest, id(tokenizer))
        self.closers = _closer_tokens(tokenizer.digest, id(tokenizer))
        self.wrap_up_at = None if max_tokens is None else max_tokens - min(reserve, max_tokens // 4)

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        if not tokens:
            return logits
        allowed = np.isfinite(logits)
        text = self.tokenizer.decode(tokens)
        if text[-1:].isdigit() and _number_too_long(text):
            n = min(len(logits), len(self.digits))
            shorter = allowed.copy()
            shorter[:n] &= ~self.digits[:n]
            if shorter.any():
                logits = np.where(shorter, logits, -np.inf)
                allowed = shorter
        loop = _cycle_token(tokens)
        if loop is not None and copy_forces(self.copies, loop):
            loop = None  # a copy forced whole repeats what its source writes (the zeros of 10000000): no loop
        if loop is not None and allowed[loop] and allowed.sum() > 1:
            logits = logits.copy()
            logits[loop] = -np.inf  # break the loop with the grammar's next-best token
        if self.wrap_up_at is not None and len(tokens) >= self.wrap_up_at:
            n = min(len(logits), len(self.closers))  # near the token limit: close what is open, where allowed
            logits = logits.copy()
            logits[:n] = np.where(self.closers[:n] & np.isfinite(logits[:n]), logits[:n] + 1e4, logits[:n])
        return logits


def generate_json(session: Session, prompt: Sequence[int], schema: dict, tokenizer, max_tokens: int = 160,
                  on_token: Callable[[str], None] | None = None, logits=None,
                  processors: Sequence = (), extend_to: int | None = None) -> ConstrainedResult:
    """Prefill `prompt` (skip when `logits` (vocab,) after it are given), then decode greedily under `schema`
    through `generate_step`: the grammar mask, then `processors` (e.g. a `CopyBias`), then the loop guard.

    `max_tokens` is the budget the loop guard wraps up in (closers preferred in its last tokens); `extend_to`
    (> max_tokens) is a larger budget for a document still open there: the same decode goes on, closers still
    preferred wherever the grammar allows one, until the grammar accepts or `extend_to` tokens (so the text
    streamed so far stays a prefix of the result: nothing is decoded again). `on_token(piece)` streams the text
    as it grows. The session keeps the prompt and every generated token except the last
    (`ConstrainedResult.decoded` counts those it holds).
    """
    from native.generate import Detokenizer, Sampler, SamplerConfig, generate_step

    t0 = time.perf_counter()
    grammar = GrammarMask(tokenizer, schema_grammar(schema))
    if grammar.error:
        return ConstrainedResult("", error=f"schema not supported by llguidance: {grammar.error}")
    text = Detokenizer(tokenizer)
    ttft = None
    eos = tokenizer.eos_ids
    start = session.n_past + (len(prompt) if logits is None else 0)
    limit = max(max_tokens, extend_to or 0)
    stream = generate_step(session, prompt, Sampler(SamplerConfig()), limit, eos,
                           [grammar, *processors, LoopGuard(tokenizer, max_tokens, copies=processors)], logits)
    for token, _ in stream:
        if ttft is None:
            ttft = time.perf_counter() - t0
        if token in eos:
            grammar.close(text.tokens + [token])
            break
        piece = text.add(token)
        if on_token and piece:
            on_token(piece)
    else:
        grammar.close(text.tokens)
    return ConstrainedResult(text.final(), text.tokens, grammar.complete, ttft or 0.0, time.perf_counter() - t0,
                             grammar.error, session.n_past - start, len(text.tokens) > max_tokens)
