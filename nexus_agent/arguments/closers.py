"""Which tokens end a JSON value, and which closers a request writes: the token classes `CopyBias` tilts and
forces (string and number closers, `}` / `]` openers, tokens holding a comma or a bracket), per tokenizer once."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from nexus_agent.arguments.constrained import _REFS, token_bytes
from nexus_agent.arguments.copy_sources import MAX_TOKEN_BYTES

_STRING_CLOSERS = set(b'",}] \n')
_NUMBER_CLOSERS = set(b",}] \n")


@lru_cache(maxsize=4)
def token_classes(digest: str, tokenizer_ref: int) -> tuple[dict[bytes, list[int]], np.ndarray, ...]:
    """Per token of the tokenizer registered in `_REFS`: the bytes index (token ids by their bytes) and the masks
    close_str, close_num, close_obj, comma, close_arr, bracket."""
    tb = token_bytes(_REFS[tokenizer_ref])
    index: dict[bytes, list[int]] = {}
    close_str = np.zeros(len(tb), dtype=bool)
    close_num = np.zeros(len(tb), dtype=bool)
    close_obj = np.zeros(len(tb), dtype=bool)
    close_arr = np.zeros(len(tb), dtype=bool)
    bracket = np.zeros(len(tb), dtype=bool)
    comma = np.zeros(len(tb), dtype=bool)
    for i, b in enumerate(tb):
        close_obj[i] = b.lstrip(b" \n\t")[:1] == b"}"
        close_arr[i] = b.lstrip(b" \n\t")[:1] == b"]"
        bracket[i] = b"]" in b
        comma[i] = b"," in b
        if 0 < len(b) <= MAX_TOKEN_BYTES:
            index.setdefault(b, []).append(i)
        if b[:1] == b'"' and all(c in _STRING_CLOSERS for c in b[1:]):
            close_str[i] = True
        if b and all(c in _NUMBER_CLOSERS for c in b) and b[0] in b",}]":
            close_num[i] = True
    return index, close_str, close_num, close_obj, comma, close_arr, bracket


def spelling(tb: list[bytes], closers: np.ndarray, written: bytes) -> np.ndarray:
    """Which of the `closers` tokens (by their bytes `tb`) spell the start of `written`, spaces and newlines
    aside."""
    out = np.zeros(len(closers), dtype=bool)
    for i in np.flatnonzero(closers):
        b = tb[i].translate(None, b" \n\t")
        out[i] = bool(b) and written.startswith(b)
    return out


def closing(text: bytes, end: int) -> bytes:
    """The closers `text` writes right after `end` (brackets, braces, commas; spaces dropped): b"]," after a
    matrix row the request goes on from, b"]]" after its last."""
    return re.match(rb"[\]\},\s]*", text[end:]).group(0).translate(None, b" \n\t\r")


def close_logprob(logprobs: np.ndarray, closers: np.ndarray) -> float:
    """log p(some token in the `closers` mask) from one row of log-probabilities: a value ends here."""
    return float(np.logaddexp.reduce(logprobs[: len(closers)][closers[: len(logprobs)]]))
