"""KV eviction: attention error, certificate, needle survival, fact recall and overhead (DESIGN §8)."""

from __future__ import annotations

import argparse
import time

import numpy as np

BUDGETS = (0.125, 0.25, 0.5)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="one replay trace, two recall traces, three recall policies, 3 survival repeats without the "
                        "redraw ablation (< 10 min on 2 cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None,
                   help="PNG path for error, certificate coverage and recall vs budget (default: next to --json)")


def _variants():
    from nexus_agent.eviction import POLICIES
    from nexus_agent.eviction.policies.certified import CertifiedPolicy

    out = {cls.name: cls() for cls in POLICIES}
    out["certified_topk"] = CertifiedPolicy(mode="topk")  # same scores, deterministic top-k
    out["certified_no_offset"] = CertifiedPolicy(offset=False)  # same sampled keep, no Hájek offset
    out["certified_poisson"] = CertifiedPolicy(mode="poisson")  # independent keeps (DESIGN §7's literal design)
    return out


def run(args: argparse.Namespace) -> dict:
    from threadpoolctl import threadpool_limits

    from evals.eviction_replay import capture, replay, spearman
    from evals.eviction_runtime import decode_overhead, fact_recall, needle_survival
    from evals.eviction_traces import make_trace, needle_positions
    from native import load_backend
    from nexus_agent.eviction import make_policy

    t_start = time.perf_counter()
    backend = load_backend("mlx")
    tok = backend.tokenizer
    n_traces, n_steps = (1, 30) if args.quick else (3, 45)
    n_recall_traces, n_surv = (2, 3) if args.quick else (4, 12)
    result: dict = {"budgets": {}, "budgets_token_level": {}, "certificate": {}, "certificate_token_level": {},
                    "config": {"quick": args.quick, "seed": args.seed, "traces": n_traces, "block": 32,
                               "model": backend.info.path.rsplit("/", 1)[-1]}}
    # (a) offline replay on captured post-RoPE Q/K/V
    caps = []
    for i in range(n_traces):
        tr = make_trace(args.seed + i, n_steps=n_steps, n_facts=4)
        ids, _ = needle_positions(tok, tr)
        q, a = tok.encode(tr.facts[0].question), tok.encode(tr.facts[0].answer)
        caps.append(capture(backend, ids + q + a + tok.encode(" and the rest of it."), len(ids) + len(q)))
    result["config"]["prompt_tokens"] = [c.n_prompt for c in caps]
    variants = _variants()
    for level, block, names in (("budgets", 32, list(variants)),
                                ("budgets_token_level", 1, ["snapkv", "reservoir", "certified", "certified_topk",
                                                            "certified_no_offset", "certified_poisson"])):
        cert_key = "certificate" if block == 32 else "certificate_token_level"
        for b in BUDGETS:
            row = result[level].setdefault(str(b), {})
            for name in names:
                errs, certs = [], []
                for ci, cap in enumerate(caps):
                    with threadpool_limits(1, user_api="blas"):  # small products: BLAS threads only contend
                        e, c, _ = replay(cap, variants[name], b, block=block, seed=args.seed + ci)
                    errs.append(e)
                    if name == "certified":
                        certs.append((c, e[:, ::4]))
                e = np.concatenate([x.ravel() for x in errs])
                row[name] = {"median_rel_err": float(np.median(e)), "p90_rel_err": float(np.percentile(e, 90))}
                if certs:
                    c = np.concatenate([x[0].ravel() for x in certs])
                    r = np.concatenate([x[1].ravel() for x in certs])
                    result[cert_key][str(b)] = {"coverage": float((r <= c).mean()), "spearman": spearman(c, r),
                                                "cells": int(len(c)), "red_flag": bool(c.mean() >= 1.0)}
    # (b) needle survival over repeated evictions (runtime MLX session): the needles are the values of 3 facts
    # in a short trace that ends asking for them, so the first eviction sees them attended; then chatter streams
    # in and every later event scores them on the window of the moment, where they look like any other chatter.
    # Budget 192 = the forced first block and recent window (64) + K = 4 reservoir blocks; each event (every 64
    # stream tokens) picks 4 of ~6 blocks. "_redraw" (outside --quick) is the ablation with fresh uniforms at
    # every event.
    tr = make_trace(args.seed + 100, n_steps=8, n_facts=3)
    pre, needles = needle_positions(tok, tr)
    pre = pre + tok.encode("Thought: I need the access codes for " + ", ".join(f.key for f in tr.facts) + ".\n")
    stream, _ = needle_positions(tok, make_trace(args.seed + 101, n_steps=20 if args.quick else 45, n_facts=0))
    surv = {}
    surv_variants = [("topk_n_inf", None, True), ("reservoir_n1", 1, True), ("reservoir_n5", 5, True)]
    for label, n, persistent in surv_variants + ([] if args.quick else [("reservoir_n5_redraw", 5, False)]):
        runs = [needle_survival(backend, pre, needles, stream, make_policy("reservoir", n=n, persistent=persistent),
                                budget=192, seed=args.seed + r) for r in range(1 if n is None else n_surv)]
        n_ev = min(len(r["survival"]) for r in runs)  # a kept partial block can shift a seed's later events
        surv[label] = {**runs[0], "survival": np.mean([r["survival"][:n_ev] for r in runs], 0).tolist(),
                       "alive": np.mean([[x > 0 for x in r["survival"][:n_ev]] for r in runs], 0).tolist(),
                       "repeats": len(runs), "events_per_repeat": [r["events"] for r in runs]}
    result["survival"] = surv
    # (c) fact recall relative to the full cache, stream and aware conditions, 25% budget
    traces = []
    for i in range(n_recall_traces):
        tr = make_trace(args.seed + 200 + i, n_steps=n_steps, n_facts=14)
        traces.append((needle_positions(tok, tr)[0], tr.facts))
    names = ["streaming", "snapkv", "certified"] if args.quick else \
        ["streaming", "h2o", "snapkv", "tova", "reservoir", "capkv", "certified"]
    rec = fact_recall(backend, traces, names, 0.25, seed=args.seed)
    result["recall"] = {"0.25": rec["stream"], "0.25_aware": rec["aware"],
                        **{k: v for k, v in rec.items() if k not in ("stream", "aware")}}
    for name, r in rec["stream"].items():
        if name in result["budgets"]["0.25"]:
            result["budgets"]["0.25"][name]["recall_rel"] = r["recall_rel"]
    ids = traces[0][0]
    # (d) overhead at the recall trace's length and at ~4k tokens (the target; ~1 min, so also in --quick)
    result["overhead"] = decode_overhead(backend, ids, budget=max(64, len(ids) // 4), rounds=3)
    long_ids = needle_positions(tok, make_trace(args.seed + 300, n_steps=100, n_facts=6))[0][:4096]
    result["overhead_4k"] = decode_overhead(backend, long_ids, budget=len(long_ids) // 4)
    result["wall_s"] = time.perf_counter() - t_start
    _print(result)
    _plot(result, args)
    return result


def _print(result: dict) -> None:
    for level in ("budgets", "budgets_token_level"):
        print(f"\n{level}: median / p90 relative attention error")
        for b, row in result[level].items():
            print(f"  budget {b}: "
                  + ", ".join(f"{k} {v['median_rel_err']:.4f}/{v['p90_rel_err']:.3f}" for k, v in row.items()))
    for key in ("certificate", "certificate_token_level"):
        print(key, {b: (round(v["coverage"], 3), round(v["spearman"], 3)) for b, v in result[key].items()})
    for label, s in result["survival"].items():
        print(f"survival {label}: events {s['events']}, final {s['survival'][-1] if s['survival'] else None}")
    for cond in ("0.25", "0.25_aware"):
        print(f"recall@{cond} (items the full cache answers: {result['recall']['full']}):")
        for name, r in result["recall"][cond].items():
            print(f"  {name}: {r['hits']}/{r['n_items']} = {r['recall_rel']:.3f}"
                  + "".join(f", {k} {v}" for k, v in r.items() if k not in ("recall_rel", "hits", "n_items")))
    print("overhead:", result["overhead"])
    if "overhead_4k" in result:
        print("overhead 4k:", result["overhead_4k"])


def _plot(result: dict, args) -> None:
    from evals.eviction_report import FIGURES
    from evals.render import save_plot

    out = args.plot or (str(args.json_out).rsplit(".", 1)[0] + ".png" if getattr(args, "json_out", None) else None)
    if out and save_plot(FIGURES, result, out):
        print(f"wrote {out}")
