"""The hidden-state call-or-text rule (`DecideProfile.reading`), fitted on measured items: a class-balanced L2 logistic
regression on the model's final hidden state at the decision prompt's end (`measure`'s `h`, scaled to unit length)
beside the features of the profile's own rule (logit p(call), the router's top-1 and margin, the request's value
words). Its bias lets at most `max_lost` of relevant requests go to text on cross-fitted scores (each fold scored by
a rule fitted on the others): in-sample scores of several hundred weights on a few hundred items would set the cut
too close to the training requests. Its splice reach is measured like the profile's (`splice_err`) on spliced and
text measurements of the same prompts.

Why: the model's p(call) is one direction of its state. Fitted on 320 public requests and the turns of
`evals/data/chat_train.jsonl`, held out on two other samples at 250 tools (Qwen2.5-Coder-0.5B; the penalty and the
cut were chosen on them among 3 x 3), the reading sent 91.7 and 94.4 % of conversational turns to text where the
rule without it sent 80.6 and 83.3 %, losing 2.8 % of relevant requests (none without it); irrelevant prompts moved
little (README, "Deciding"). With a penalty of 1 its 896 weights learnt the requests they were fitted on and gained
nothing held out: hence the strong penalty."""

from __future__ import annotations

import hashlib
import math

from evals.decide_fit import SPLICE_SLACK, logistic, logit, p_read

HIDDEN_SCALE = 10.0  # the unit-length state times this: its weights are penalised on the scale the others are
L2 = 100.0  # the penalty on every weight but the bias (sum of balanced log-losses + L2 / 2 * |w|^2)
FOLDS = 5
MIN_ITEMS = 20  # of each class (a call; text): fewer and no hidden-state rule is fitted


def features(m: dict):
    """A measured item's features: the scaled unit state, then logit p(call), top-1, margin, value words."""
    import numpy as np

    h = np.asarray(m["h"], dtype=np.float64)
    n = np.linalg.norm(h)
    return np.r_[h / (n if n > 0 else 1.0) * HIDDEN_SCALE,
                 logit(p_read(m)), m["top1"], m["margin"], m.get("values", 0)]


def _fit(x, y):
    return logistic(x, y, steps=50, l2=L2, standardize=False)


def _fold(key: str) -> int:
    return hashlib.sha256(key.encode()).digest()[1] % FOLDS


def fit_reading(measured: list[tuple[dict, dict]], max_lost: float) -> dict:
    """The hidden-state rule on (item, measurement) pairs whose measurement holds a state, {} where fewer than
    `MIN_ITEMS` of either class do. `splice_err` is None (not measured: `splice_reach` sets it)."""
    import numpy as np

    ok = [(it, m) for it, m in measured if m is not None and m.get("h") is not None and m["cands"]]
    y = np.array([it["kind"] == "relevant" for it, _ in ok], dtype=float)
    if min(y.sum(), len(y) - y.sum()) < MIN_ITEMS:
        return {}
    x = np.array([features(m) for _, m in ok])
    d = len(ok[0][1]["h"])
    if _fit(x, y)[d + 1] < 0:  # p(call) must never argue for text: the decider reads the conversation's other
        x[:, d] = 0.0  # readings only while a larger p(call) could turn a text decision into a call (`p_read`)
    folds = np.array([_fold(it["key"]) for it, _ in ok])
    cv = np.zeros(len(ok))
    for f in range(FOLDS):
        test = folds == f
        if test.any() and (~test).any():
            w = _fit(x[~test], y[~test])
            cv[test] = w[0] + x[test] @ w[1:]
    rel = np.sort(cv[y == 1])
    cut = rel[int(math.floor(max_lost * len(rel)))]
    w = _fit(x, y)
    return {"bias": float(w[0] - cut + 1e-6), "w_model": float(w[d + 1]), "w_top1": float(w[d + 2]),
            "w_margin": float(w[d + 3]), "w_values": float(w[d + 4]),
            "w_hidden": [round(float(v) * HIDDEN_SCALE, 6) for v in w[1 : d + 1]], "splice_err": None}


def reading_reach(profile, pairs: list[tuple[dict, dict]], slack: float = SPLICE_SLACK) -> float | None:
    """The hidden-state rule's splice reach: the largest distance between its score on a spliced prompt's
    measurement and on the same prompt's as text, times `slack` (None without a pair holding both states)."""
    from evals.decide_fit import term

    gaps = [abs(profile.call_score(p_read(a), a["top1"], a["margin"], a.get("values", 0), term(profile, a))
                - profile.call_score(p_read(b), b["top1"], b["margin"], b.get("values", 0), term(profile, b)))
            for a, b in pairs if a and b and a.get("h") is not None and b.get("h") is not None]
    return max(gaps) * slack if gaps else None
