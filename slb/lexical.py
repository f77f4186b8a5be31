"""BM25 of a query against a registry's tool texts: the lexical term fused with the cosine when reranking.

Terms are lowercase alphanumeric words of >= 3 characters (camelCase, `_` and `.` split), lightly stemmed
(ing / ies→y / es / ed / s, only when >= 4 characters remain). IDF is computed over the index's own rows, i.e.
the registry a deployment routes over, not a global corpus.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

_CAMEL = re.compile(r"([a-z])([A-Z])")
_WORD = re.compile(r"[a-z0-9]+")
_SUFFIXES = (("ing", ""), ("ies", "y"), ("es", ""), ("ed", ""), ("s", ""))


def stem(word: str) -> str:
    """Strip the first matching suffix of ing / ies (→ y) / es / ed / s when >= 4 characters remain."""
    for suf, rep in _SUFFIXES:
        if word.endswith(suf) and len(word) - len(suf) >= 4:
            return word[: -len(suf)] + rep
    return word


def terms(text: str) -> list[str]:
    """Stemmed lowercase words of >= 3 characters: `getUserInfo files_listing` -> get user info file listing."""
    words = _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower())  # `_`, `.` and other punctuation split words
    return [stem(w) for w in words if len(w) >= 3]


class LexicalIndex:
    """Term counts of N tool texts; `scores(query, rows)` is BM25 (k1, b) of the query for the given rows, with
    IDF and the mean length taken over the index's rows. `subset(rows)` is the index of some of the rows
    (shares the per-tool counts; document frequencies are summed lazily over the subset, per query term)."""

    def __init__(self, texts: Sequence[str] = (), k1: float = 1.2, b: float = 0.75, *,
                 _counts: list[Counter] | None = None):
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b = k1, b
        self.counts = _counts if _counts is not None else [Counter(terms(t)) for t in texts]
        self.lengths = np.array([sum(c.values()) for c in self.counts], np.float64)
        self.avg_len = float(self.lengths.mean()) if len(self.counts) else 0.0
        self._df: dict[str, int] = {}
        if _counts is None:  # built from texts: all document frequencies at once (one pass)
            self._df = dict(Counter(w for c in self.counts for w in c))
            self._complete = True
        else:
            self._complete = False

    def __len__(self) -> int:
        return len(self.counts)

    def subset(self, rows: Sequence[int]) -> "LexicalIndex":
        """The index of rows[0], rows[1], ... (row j of the subset is row rows[j] here); IDF over those rows only."""
        return LexicalIndex(k1=self.k1, b=self.b, _counts=[self.counts[int(i)] for i in rows])

    def df(self, term: str) -> int:
        """Rows whose text contains `term`."""
        n = self._df.get(term)
        if n is None:
            n = 0 if self._complete else sum(1 for c in self.counts if term in c)
            self._df[term] = n
        return n

    def idf(self, term: str) -> float:
        n = self.df(term)
        return math.log(1 + (len(self.counts) - n + 0.5) / (n + 0.5))

    def scores(self, query: str, rows: Sequence[int]) -> np.ndarray:
        """(len(rows),) BM25 of `query` for the given rows (each distinct query term counted once)."""
        qterms = set(terms(query))
        out = np.zeros(len(rows), np.float64)
        if not qterms or not len(self.counts):
            return out
        idf = {w: self.idf(w) for w in qterms}
        k1, b, avg = self.k1, self.b, self.avg_len or 1.0
        for j, r in enumerate(rows):
            c = self.counts[int(r)]
            norm = k1 * (1 - b + b * self.lengths[int(r)] / avg)
            out[j] = sum(idf[w] * c[w] * (k1 + 1) / (c[w] + norm) for w in qterms if w in c)
        return out


def normalized(lex: np.ndarray) -> np.ndarray:
    """Scores divided by their maximum over the last axis (rows with all zeros stay 0)."""
    lex = np.asarray(lex, np.float64)
    mx = lex.max(axis=-1, keepdims=True) if lex.size else lex
    return np.divide(lex, mx, out=np.zeros_like(lex), where=mx > 0)
