"""Calibrating who decides (`nexus eval decide --calibrate`): from each item's measurements (the model's p(call),
the router's top-1 and margin, the request's value words, every candidate's name log-probability) fit a
`DecideProfile`: class-balanced logistic weights for call vs text, the bias that loses at most `max_lost` of
relevant requests, the p(call) below which the model's own "no" overrules the router (`p_veto`), the router weight
on names and one offset for every candidate listed after the first (against a first-listed bias, or for the
router's order), and "router" mode when the model's decisions score below the router's. `apply` is the decision a
profile makes on one measured item."""

from __future__ import annotations

import math
from dataclasses import replace

BETAS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
VETO_MARGIN = 3.0  # p_veto is the lowest relevant request's p(call) divided by this
VETO_CAP = 0.05  # and at most this
MIN_GAIN = 2  # relevant items a name setting must gain to move
RANK_OFFSETS = (-8.0, -6.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 6.0)


def apply(profile, m: dict) -> str | None:
    """The decision `profile` makes on a measured item: a tool name, or None for a text answer."""
    if m is None or not m["cands"]:
        return None
    if profile.call_score(p_read(m), m["top1"], m["margin"], m.get("values", 0), term(profile, m)) <= 0 \
            or vetoed(profile, m):
        return None
    return choose_name(profile, m)


def term(profile, m: dict) -> float | None:
    """The hidden-state rule's term on a measured item (None: the profile has no such rule or the item no state)."""
    return profile.hidden_term(m.get("h"))


def choose_name(profile, m: dict) -> str:
    """The candidate a call of `profile` names on a measured item."""
    return max(_name_totals(profile, m))[1]


def _name_totals(profile, m: dict) -> list[tuple[float, str]]:
    """(`DecideProfile.name_score`, name) of each candidate of a measured item."""
    return [(profile.name_score(m["lps"].get(c, -1e9), sc, r), c)
            for r, (c, sc) in enumerate(zip(m["cands"], m["scores"]))]


def fit(measured: list[tuple[dict, dict]], router_acc: float, max_lost: float, k: int, fit_all: int,
        name_weight: float | None = None, reading: bool = False):
    """The decide profile fitted on (item, measurement) pairs: logistic weights on (logit p_call, top-1, margin, the
    request's value words) with balanced classes, the bias moved so at most `max_lost` of relevant items answer in
    text, the name weight with the best tool accuracy, and mode "router" when the model's decisions score below
    `router_acc`. `name_weight`: the router's weight on names, fixed instead of fitted; `reading`: also the
    hidden-state rule (`decide_reading.fit_reading`) on the items that hold a state."""
    import numpy as np

    from evals.decide_reading import fit_reading
    from nexus_agent.turn.profile import DecideProfile

    ok = [(it, with_values(it, m)) for it, m in measured if m is not None]
    x = np.array([[logit(p_read(m)), m["top1"], m["margin"], m["values"]] for _, m in ok])
    y = np.array([it["kind"] == "relevant" for it, _ in ok], dtype=float)
    w = logistic(x, y)
    z = x @ w[1:]
    rel = np.sort(z[y == 1])
    cut = rel[int(math.floor(max_lost * len(rel)))] if len(rel) else 0.0
    bias = -(cut - 1e-6)
    beta, ranks = _fit_names([(it, m) for it, m in ok if it["kind"] == "relevant"], k,
                             BETAS if name_weight is None else (name_weight,))
    prof = DecideProfile(mode="model", k=k, fit_all=fit_all, bias=float(bias), w_model=float(w[1]),
                         w_top1=float(w[2]), w_margin=float(w[3]), w_values=float(w[4]), name_weight=beta,
                         rank_bias=ranks, p_veto=veto_level(ok),
                         reading=fit_reading(ok, max_lost) if reading else {},
                         source=f"calibrated by nexus eval decide on {len(ok)} items")
    acc = np.mean([apply(prof, m) == it["gold"] for it, m in ok]) if ok else 0.0
    if acc < router_acc:
        prof = replace(prof, mode="router")
    prof.metrics = {"decision_acc": float(acc), "router_decision_acc": float(router_acc)}
    return prof


def p_read(m: dict) -> float:
    """The p(call) a decision uses: the largest of the conversation's reading and those beside it (`p_beside`,
    `engine.readings`: the decider reads them in turn while the score says text, so with a positive weight on
    p(call) it decides a call exactly when the largest does; None: a reading the backend could not take)."""
    return max([m["p_call"], *(p for p in m.get("p_beside", ()) if p is not None)])


def read_as_decided(profile, m: dict) -> tuple[float, bool]:
    """(p(call), a reading unread) as the decider leaves them on a measured item: the conversation's reading, then
    those beside it in turn until one decides a call (`Decider._call_or_text`)."""
    p, unread, h = m["p_call"], False, term(profile, m)
    if not profile.calls(p, m["top1"], m["margin"], m.get("values", 0), hidden=h):
        for q in m.get("p_beside", ()):
            if q is None:
                unread = True
                continue
            p = max(p, q)
            if profile.calls(p, m["top1"], m["margin"], m.get("values", 0), hidden=h):
                break
    return p, unread


def splice_near(profile, m: dict) -> str | None:
    """The offline twin of the decider's recheck on a spliced prompt's measurement: "call" where its p(call)
    is within the profile's `splice_err` of the other outcome, "name" where a call's chosen name is within
    `splice_name_err` of another name; else None."""
    if m is None or not m["cands"]:
        return None
    p, unread = read_as_decided(profile, m)
    if profile.splice_may_flip(p, m["top1"], m["margin"], m.get("values", 0), unread, term(profile, m)):
        return "call"
    if not profile.splice_name_err or apply(profile, m) is None:
        return None
    totals = sorted(t for t, _ in _name_totals(profile, m))
    return "name" if len(totals) > 1 and totals[-1] - totals[-2] <= profile.splice_name_err else None


def rechecked_pick(profile, spliced: dict, text: dict) -> tuple[str | None, str | None]:
    """(the decision the decider makes on a spliced prompt, what it rechecked on the prompt as text) from the two
    measurements of one item: call or text from the text reading where "call" was rechecked, the name from it where
    either was."""
    near = splice_near(profile, spliced)
    if near is None:
        return apply(profile, spliced), None
    return apply(profile, text) if near == "call" else choose_name(profile, text), near


SPLICE_SLACK = 1.25  # the splice's reach is the largest distance measured times this
NAME_SPAN = 6.0  # names further below the best name as text than this are out of any choice (rank offsets <= 4)


def splice_reach(pairs: list[tuple[dict, dict]], slack: float = SPLICE_SLACK) -> tuple[float, float]:
    """(splice_err, splice_name_err) from (spliced, text) measurements of the same prompts: the largest distance
    between their logit p(call) on any reading, and between their log-probability gaps of two names (of those
    within `NAME_SPAN` of the best as text: a splice moves an unlikely name's log-probability by several nats,
    which no choice sees), times `slack`."""
    err = name_err = 0.0
    for a, b in pairs:
        if not (a and b):
            continue
        for p, q in zip([a["p_call"], *a.get("p_beside", ())], [b["p_call"], *b.get("p_beside", ())]):
            if p is not None and q is not None:
                err = max(err, abs(logit(p) - logit(q)))
        top = max(b["lps"].values(), default=0.0)
        d = [a["lps"][n] - lp for n, lp in b["lps"].items() if n in a["lps"] and lp >= top - NAME_SPAN]
        if len(d) > 1:
            name_err = max(name_err, max(d) - min(d))
    return err * slack, name_err * slack


def vetoed(profile, m: dict) -> bool:
    """Whether the model's own p(call) is below the profile's `p_veto` on every reading of a measured item."""
    return p_read(m) < profile.p_veto and None not in m.get("p_beside", ())


def veto_level(measured: list[tuple[dict, dict]]) -> float:
    """`p_veto` for measured items: a `VETO_MARGIN`-th of the lowest p(call) of a relevant request among them, at
    most `VETO_CAP` (0 without one): the model's "no" overrules the router only where the model is all but sure,
    well below any request's p(call) (on a few dozen requests the lowest is 0.066 on one sample of the public data,
    0.64 on another)."""
    rel = [p_read(m) for it, m in measured if it["kind"] == "relevant"]
    return min(VETO_CAP, min(rel) / VETO_MARGIN) if rel else 0.0


def with_values(it: dict, m: dict) -> dict:
    """`m` with the request's value words (`request_parts.request_values` of the item's last user message), which
    measurements before they were recorded lack."""
    if m is not None and "values" not in m:
        from nexus_agent.turn.engine import last_user
        from nexus_agent.turn.request_parts import request_values

        m["values"] = request_values(last_user(it.get("messages", [])))
    return m


def _fit_names(rel: list, k: int, betas=BETAS, passes: int = 2) -> tuple[float, list[float]]:
    """The router weight on names and one offset for every candidate listed after the first, with the best tool
    accuracy on relevant items (coordinate ascent over small grids). A value moves away from the one it has only when
    it names `MIN_GAIN` more tools right: on a few dozen requests one item is noise. Among the offsets that tie for the
    best, the one nearest the middle of their range: the plateau's edge sits on one item's log-probability gap.

    One offset, not one per rank: a positive one counters a model that favours the first tool listed, a negative one
    makes the model beat the router's first pick by that many nats. Per-rank offsets fitted on 72 requests (stop 56:
    [0, -4, 0, 0, 0]) penalised the second candidate and not the third; fitted on three of four fresh samples and
    scored on the fourth, per-rank offsets and one offset both named 126 of 144 right (stop 62, README "Which
    name"): one parameter is less to overfit."""
    from nexus_agent.turn.profile import DecideProfile

    def acc(beta, off):
        p = DecideProfile(k=k, bias=1e6, name_weight=beta, rank_bias=[0.0] + [off] * (k - 1))
        return sum(apply(p, m) == it["gold"] for it, m in rel)

    beta, off = betas[0], 0.0
    for _ in range(passes):
        best = max(betas, key=lambda b: (acc(b, off), -b))
        if acc(best, off) >= acc(beta, off) + MIN_GAIN:
            beta = best
        scores = {o: acc(beta, o) for o in RANK_OFFSETS}
        top = [o for o in RANK_OFFSETS if scores[o] == max(scores.values())]
        mid = (min(top) + max(top)) / 2
        best = min(top, key=lambda o: (abs(o - mid), abs(o)))
        if scores[best] >= acc(beta, off) + MIN_GAIN:
            off = best
    return float(beta), [0.0] + [float(off)] * (k - 1)


def logit(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))


def logistic(x, y, steps: int = 200, l2: float = 1e-2, standardize: bool = True):
    """Weights [b, w...] of a class-balanced L2 logistic regression (Newton's method; the bias is not penalised),
    on the raw features' scale. `standardize`: each feature scaled to unit variance first, so the penalty weighs
    them alike (off: the caller has put them on one scale, `decide_reading.features`)."""
    import numpy as np

    mu, sd = (x.mean(0), x.std(0) + 1e-9) if standardize else (np.zeros(x.shape[1]), np.ones(x.shape[1]))
    xs = np.c_[np.ones(len(x)), (x - mu) / sd]
    cw = np.where(y == 1, 0.5 / max(y.mean(), 1e-9), 0.5 / max(1 - y.mean(), 1e-9))
    pen = np.full(xs.shape[1], l2)
    pen[0] = 0.0
    w = np.zeros(xs.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-np.clip(xs @ w, -50, 50)))
        g = xs.T @ (cw * (p - y)) + pen * w
        h = (xs * (cw * p * (1 - p))[:, None]).T @ xs + np.diag(pen) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(h, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    ws = w[1:] / sd  # back to raw features
    return np.r_[w[0] - (ws * mu).sum(), ws]
