"""KV eviction: attention error, certificate, needle survival, fact recall and overhead (DESIGN §8)."""

from __future__ import annotations

import argparse
import time

import numpy as np

BUDGETS = (0.125, 0.25, 0.5)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="one trace, fewer steps (< 10 min on 2 cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="PNG path for error and recall vs budget (default: next to --json)")


def _variants():
    from nexus_agent.eviction import POLICIES
    from nexus_agent.eviction.policies.certified import CertifiedPolicy

    out = {cls.name: cls() for cls in POLICIES}
    out["certified_topk"] = CertifiedPolicy(mode="topk")  # same scores, deterministic top-k
    out["certified_no_offset"] = CertifiedPolicy(offset=False)  # Poisson keep, no Hájek offset
    return out


def run(args: argparse.Namespace) -> dict:
    from threadpoolctl import threadpool_limits

    from native import load_backend
    from nexus_agent.eviction import make_policy
    from evals.eviction_replay import capture, replay, spearman
    from evals.eviction_runtime import decode_overhead, fact_recall, needle_survival
    from evals.eviction_traces import make_trace, needle_positions

    t_start = time.perf_counter()
    backend = load_backend("mlx")
    tok = backend.tokenizer
    n_traces, n_steps = (1, 30) if args.quick else (3, 45)
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
                                ("budgets_token_level", 1, ["snapkv", "reservoir", "certified", "certified_topk", "certified_no_offset"])):
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
    # (b) needle survival over repeated evictions (runtime MLX session)
    tr = make_trace(args.seed + 100, n_steps=n_steps, n_facts=6)
    ids, needles = needle_positions(tok, tr)
    surv = {}
    for label, n in (("topk_n_inf", None), ("reservoir_n1", 1), ("reservoir_n5", 5)):
        surv[label] = needle_survival(backend, ids, needles, make_policy("reservoir", n=n), budget=128, seed=args.seed)
    result["survival"] = surv
    # (c) fact recall relative to the full cache, stream condition, 25% budget
    tr = make_trace(args.seed + 200, n_steps=n_steps, n_facts=6)
    ids, _ = needle_positions(tok, tr)
    names = ["streaming", "snapkv", "certified", "certified+recall", "certified+recall_always"] if args.quick else \
        ["streaming", "h2o", "snapkv", "tova", "reservoir", "capkv", "certified", "certified+recall", "certified+recall_always"]
    rec = fact_recall(backend, ids, tr.facts, names, 0.25, seed=args.seed)
    result["recall"] = {"0.25": rec}
    for name, r in rec.items():
        if name in result["budgets"]["0.25"] and "recall_rel" in r:
            result["budgets"]["0.25"][name]["recall_rel"] = r["recall_rel"]
    # (d) overhead
    result["overhead"] = decode_overhead(backend, ids, budget=max(64, len(ids) // 4))
    result["wall_s"] = time.perf_counter() - t_start
    _print(result)
    _plot(result, args)
    return result


def _print(result: dict) -> None:
    for level in ("budgets", "budgets_token_level"):
        print(f"\n{level}: median / p90 relative attention error")
        for b, row in result[level].items():
            print(f"  budget {b}: " + ", ".join(f"{k} {v['median_rel_err']:.4f}/{v['p90_rel_err']:.3f}" for k, v in row.items()))
    for key in ("certificate", "certificate_token_level"):
        print(key, {b: (round(v["coverage"], 3), round(v["spearman"], 3)) for b, v in result[key].items()})
    for label, s in result["survival"].items():
        print(f"survival {label}: events {s['events']}, final {s['survival'][-1] if s['survival'] else None}")
    print("recall@25% stream:", result["recall"]["0.25"])
    print("overhead:", result["overhead"])


def _plot(result: dict, args) -> None:
    out = args.plot or (str(args.json_out).rsplit(".", 1)[0] + ".png" if getattr(args, "json_out", None) else None)
    if not out:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    budgets = [float(b) for b in result["budgets"]]
    for name in result["budgets"][str(budgets[0])]:
        ax1.plot(budgets, [result["budgets"][str(b)][name]["median_rel_err"] for b in budgets], marker="o", label=name)
    ax1.set(xlabel="KV budget (fraction of prompt)", ylabel="median relative attention-output error", xscale="log")
    ax1.legend(fontsize=6)
    rec = result["recall"]["0.25"]
    names = [k for k in rec if "recall_rel" in rec[k]]
    ax2.bar(names, [rec[k]["recall_rel"] for k in names])
    ax2.set(xlabel="policy (budget 0.25, stream condition)", ylabel="fact recall relative to full cache")
    ax2.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
