"""`nexus eval decide`'s scoring: a measured item's row under a profile (`row`), the metrics of rows (`score`), a
spliced variant's fidelity to the same candidates prefilled as text (`splice_fidelity`) and the profile fitted on a
run's measurements with cross-fitted scores (`calibrate`)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from evals.decide_fit import apply, fit, rechecked_pick, splice_reach
from evals.decide_measure import variant
from evals.decide_reading import reading_reach

FIT_ALL = 10  # a registry this small is shown whole


def _half(text: str) -> int:
    return hashlib.sha256(text.encode()).digest()[0] & 1


def score(rows: list[dict]) -> dict:
    """Metrics of rows {kind, gold, pick, recall?, decide_ms?, call_ms?, prompt_tokens?}."""
    import numpy as np

    def share(sel, ok):
        sel = [r for r in rows if sel(r)]
        return float(np.mean([ok(r) for r in sel])) if sel else None

    def p50(key):
        v = [r[key] for r in rows if r.get(key) is not None]
        return float(np.median(v)) if v else None

    right = lambda r: r["pick"] == r["gold"]  # noqa: E731  (None == None: no call where none is wanted)
    rel = lambda r: r["kind"] == "relevant"  # noqa: E731
    return {"decision_acc": share(lambda r: True, right), "tool_acc": share(rel, right),
            "irrelevant_no_call": share(lambda r: r["kind"] == "irrelevant", lambda r: r["pick"] is None),
            "chat_no_call": share(lambda r: r["kind"] == "chat", lambda r: r["pick"] is None),
            "relevant_no_call": share(rel, lambda r: r["pick"] is None),
            "recall_at_k": share(rel, lambda r: r.get("recall", False)),
            "failed": sum(1 for r in rows if r.get("failed")),
            "decide_ms_p50": p50("decide_ms"), "prefill_ms_p50": p50("prefill_ms"), "call_ms_p50": p50("call_ms"),
            "prompt_tokens_p50": p50("prompt_tokens"), "n": len(rows)}


FAILED = "<failed>"  # the pick of an item the variant could not decide (its prompt overflowed the context)


def row(it: dict, m: dict | None, profile) -> dict:
    if m is None:  # neither a call nor a text answer: wrong for every kind, counted in "failed"
        return {**it, "pick": FAILED, "failed": True}
    return {**it, "pick": apply(profile, m), "recall": it["gold"] in m["cands"], "decide_ms": m["decide_ms"],
            "prefill_ms": m["prefill_ms"], "prompt_tokens": m["prompt_tokens"]}


def neutral(profile):
    """The model's own decision: p(call) > 0.5 and its likeliest name (the profile's order offsets, veto and
    splice reach kept)."""
    return replace(profile, mode="model", bias=0.0, w_model=1.0, w_top1=0.0, w_margin=0.0, w_values=0.0,
                   name_weight=0.0)


def splice_fidelity(res: dict, meas: dict, profile) -> None:
    """Each spliced variant's fidelity to the same candidates prefilled as text (`_fidelity`), with `profile`'s
    splice reach: decided by the model alone (`neutral`; keys without a suffix) and by `profile` (`_nexus`)."""
    for vname, pairs in meas.items():
        text = meas.get(vname.removesuffix("-splice"))
        if vname.endswith("-splice") and text and vname in res:
            res[vname].update(_fidelity(pairs, text, neutral(profile)))
            if profile.mode == "model":
                res[vname].update(_fidelity(pairs, text, profile, "_nexus"))


def _fidelity(spliced: list, text: list, profile, key: str = "") -> dict:
    """The spliced variant against the same candidates prefilled as text, decided by `profile`: the share of items
    decided the same (call or not, and which), with the decider's recheck on the prompt as text where the
    spliced reading is within the profile's splice reach of another outcome (`decide_fit.rechecked_pick`; its
    prefill then counts both times), the share rechecked, and the prefill speed-up (text prefill / spliced, p50 and
    mean). `key`: a suffix of the keys (`_nexus`: decided by the shipped setting)."""
    import numpy as np

    same, pf, rechecked = [], [], 0
    for (_, a), (_, b) in zip(spliced, text):
        if a and b:
            pick, near = rechecked_pick(profile, a, b)
            same.append(pick == apply(profile, b))
            pf.append(a["prefill_ms"] + (b["prefill_ms"] if near else 0.0))
            rechecked += near is not None
    pt = [m["prefill_ms"] for (_, m), (_, a) in zip(text, spliced) if m and a]
    return {f"same_as_text{key}": float(np.mean(same)) if same else None,
            f"rechecked{key}": rechecked / len(same) if same else None,
            f"prefill_speedup{key}": float(np.median(pt) / np.median(pf)) if pf else None,
            f"prefill_speedup_mean{key}": float(np.mean(pt) / np.mean(pf)) if pf else None}


def calibrate(args, per_size: dict, out: dict, name: str, k_sure: int = 0, reach: tuple = (0.0, 0.0, None)):
    """Fit the profile on every size's top-k measurements (cross-fitted `nexus` scores per size), return the
    profile fitted on all of them. `k_sure`: the model's current setting, kept unless --calibrate-k-sure says;
    `reach`: its (splice_err, splice_name_err, the hidden-state rule's splice_err), measured again where the run
    spliced (`splice_reach`, `decide_reading.reading_reach`)."""
    k, sure = args.calibrate_k, getattr(args, "calibrate_k_sure", None)
    sure = k_sure if sure is None else sure
    key = variant(k, sure)
    pooled = [(it, m) for s in per_size.values() for it, m in s["meas"].get(key, [])]
    if not pooled:
        raise SystemExit(f"nexus eval decide --calibrate: no {key} measurements (add {k} to --ks"
                         + (f", {sure} to --k-sure)" if sure else ")"))
    router_acc = _router_acc(per_size)
    for size, s in per_size.items():
        if key not in s["meas"]:
            continue
        rows = []
        for half in (0, 1):
            train = [(it, m) for it, m in pooled if _half(it["key"]) != half]
            prof = fit(train, router_acc, args.max_lost, k, FIT_ALL, getattr(args, "name_weight", None),
                       getattr(args, "reading", False))
            rows += [row(it, m, prof) if prof.mode == "model" else None
                     for it, m in s["meas"][key] if _half(it["key"]) == half]
        if all(r is not None for r in rows):
            timed = out["sizes"][str(size)][name].get("nexus", {}).get("call_ms_p50")  # kept by a refit
            out["sizes"][str(size)][name]["nexus"] = dict(score(rows), call_ms_p50=timed)
    pairs = [(a, b) for s in per_size.values() for v, ms in s["meas"].items() if v.endswith("-splice")
             for (_, a), (_, b) in zip(ms, s["meas"].get(v.removesuffix("-splice"), []))]
    err, name_err = splice_reach(pairs) if pairs else reach[:2]
    prof = replace(fit(pooled, router_acc, args.max_lost, k, FIT_ALL, getattr(args, "name_weight", None),
                       getattr(args, "reading", False)), k_sure=sure, splice_err=err, splice_name_err=name_err)
    if prof.reading:
        measured = reading_reach(prof, pairs)
        prof.reading["splice_err"] = measured if measured is not None else (reach[2] if len(reach) > 2 else None)
    return prof


def _router_acc(per_size: dict) -> float:
    accs = [s["res"]["router"]["decision_acc"] for s in per_size.values()]
    return float(sum(accs) / len(accs)) if accs else 0.0
