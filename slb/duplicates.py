"""Near-duplicate tools: different names, the same job (`final_velocity` / `calculate_final_velocity`).

Two tools are near-duplicates when the cosine of their embedded tool texts (the buffer's first row of each
tool, slb.tools.tool_text) is at least DUPLICATE_COSINE. On the public catalogue (2,052 BFCL tools,
all-MiniLM-L6-v2) 0.93 gives 60 pairs, nearly all true duplicates (`math.factorial` / `math_factorial`,
`gcd` / `number_theory.gcd`); just below it sit opposite jobs (`convert_celsius_to_fahrenheit` /
`fahrenheit_to_celsius`, 0.928), so the threshold is not lowered further.

The buffer stores the pairs (computed at build); the margin gate measures the margin from the top-1 to the
first candidate that is not its duplicate, and a decision whose runners-up are duplicates of the chosen tool
says so (slb.router.RouteDecision.duplicates).
"""

from __future__ import annotations

import numpy as np

DUPLICATE_COSINE = 0.93
MAX_TOOLS = 50_000  # above this the O(T^2 D) all-pairs pass is skipped at build (no pairs stored)


def duplicate_pairs(x: np.ndarray, threshold: float = DUPLICATE_COSINE,
                    block: int = 1024) -> list[tuple[int, int, float]]:
    """(a, b, cosine) with a < b for every pair of rows of x (T, D) float32 unit rows whose cosine is >=
    threshold, sorted by cosine descending. Blocks of `block` rows against all later rows: O(T^2 D) flops,
    O(block * T) memory."""
    x = np.ascontiguousarray(x, np.float32)
    out: list[tuple[int, int, float]] = []
    for a0 in range(0, len(x), block):
        s = x[a0:a0 + block] @ x[a0:].T  # (b, T - a0)
        r, c = np.nonzero(s >= threshold)
        for i, j in zip(r.tolist(), c.tolist()):
            if a0 + i < a0 + j:
                out.append((a0 + i, a0 + j, float(s[i, j])))
    return sorted(out, key=lambda p: -p[2])


def duplicate_map(pairs, n: int | None = None) -> dict[int, dict[int, float]]:
    """tool index -> {duplicate index: cosine} from (a, b, cosine) pairs (both directions)."""
    out: dict[int, dict[int, float]] = {}
    for a, b, c in pairs:
        out.setdefault(int(a), {})[int(b)] = float(c)
        out.setdefault(int(b), {})[int(a)] = float(c)
    return out


def margin_to_distinct(scores: np.ndarray, ids: np.ndarray, dups: dict[int, dict[int, float]]) -> float:
    """top-1 score minus the score of the first candidate that is not a near-duplicate of the top-1 (the last
    candidate's when all are); 1.0 for a single candidate. scores/ids (k,) best first."""
    if len(scores) < 2:
        return 1.0
    mine = dups.get(int(ids[0]), {})
    for s, i in zip(scores[1:], ids[1:]):
        if int(i) not in mine:
            return float(scores[0] - s)
    return float(scores[0] - scores[-1])
