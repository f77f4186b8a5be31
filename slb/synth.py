"""Training queries synthesized from the registry's own tools (no labelled data needed).

A deployment has tool schemas but rarely labelled requests; the reranker and the gate learn from requests
written from each tool's description and parameter names, with word dropout so that they do not learn to
copy the description verbatim.
"""

from __future__ import annotations

import random
import re

from slb.tools import ToolEntry, _split_identifier, param_names

_OPENERS = ("", "", "Please ", "Can you ", "I need to ", "Help me ", "I want to ", "Could you ")
_JOINERS = (" with ", " given ", " using ", " for ")
_VALUES = ("5", "10", "42", "2024", "'abc'", "3.5", "the default", "x", "New York", "true")


def _verb_base(word: str) -> str:
    """'Calculates' -> 'calculate', 'Retrieves' -> 'retrieve' (third person to base form, heuristic)."""
    w = word.lower()
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith(("ches", "shes", "sses", "xes")):
        return w[:-2]
    if w.endswith("s") and not w.endswith("ss") and len(w) > 3:
        return w[:-1]
    return w


def _first_sentence(text: str) -> str:
    text = re.sub(r"\s+", " ", text or "").strip()
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text).rstrip(".!? ")


def _dropout(words: list[str], rng: random.Random, p: float) -> list[str]:
    kept = [w for w in words if rng.random() >= p]
    return kept if len(kept) >= 2 else words


def synthesize_queries(tool: ToolEntry, n: int, rng: random.Random) -> list[str]:
    """n request-like strings for `tool` from its description, name and parameter names."""
    sent = _first_sentence(tool.description) or _split_identifier(tool.name)
    words = sent.split()
    if words:
        words[0] = _verb_base(words[0])
    params = [_split_identifier(p) for p in param_names(tool.input_schema)]
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:  # description as a request
            q = rng.choice(_OPENERS) + " ".join(_dropout(words, rng, 0.15))
        elif kind == 1:  # description + parameter values
            q = rng.choice(_OPENERS) + " ".join(_dropout(words[:12], rng, 0.25))
            if params:
                chosen = rng.sample(params, min(len(params), rng.randint(1, 3)))
                q += rng.choice(_JOINERS) + " and ".join(f"{p} {rng.choice(_VALUES)}" for p in chosen)
        else:  # terse: name words and parameters
            q = _split_identifier(tool.name).lower()
            if params:
                q += " " + " ".join(rng.sample(params, min(len(params), 2)))
        out.append(q.strip())
    return out
