"""Routing accuracy vs registry size: float32 and INT8 embedding top-1, gated + reranked routing.

For every scored query and size N the registry is its gold tool plus N−1 distractors drawn from the
catalogue with a seeded RNG. tau and the score floor are fitted per size on calibration queries (`--calib`,
default the `--queries` file, minus any query being scored; when nothing is left, 2-fold cross-fitting split by
gold tool: each fold is scored with thresholds fitted on the other). The reranker is trained on queries
synthesized from the catalogue (plus calibration queries disjoint from the scored ones), never on scored
queries, and reused from the Nexus home when it matches. When cross-fitting, one reranker is trained per
fold, on the synthesized queries plus the other fold's labelled queries, and scores only its own fold.

Below tau the candidates are ordered by cosine + lex_weight · BM25/max BM25 (IDF over the query's registry,
slb.lexical) + ce_weight · cross-encoder logit; both weights are fitted (gate.pick_fusion_weights) at one size
on calibration queries or the other fold. top1_routed_lex is the same gate with ce_weight 0 (lexical only).
The margin is measured to the first candidate that is not a near-duplicate of the top-1 (slb.duplicates);
top1_routed_dup_aware also counts a near-duplicate of the gold tool as correct (top1_routed stays strict).
top1_learned: the sequential protocol of learning from confirmed calls (evals.routing_protocols.route_learned).
relevant_to_none: share of relevant queries routed to none; none_precision: share of --irrelevant prompts routed to
none.
decision_ms_p50/p99: the whole decision (query embedding + scan + gate + fusion) on the first --timed queries.
Every column of a size scores each query on one registry (the same sample for embed, INT8 and routing).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from pathlib import Path

from evals.render import Figure, log_ticks, md_table, pct, pyplot, save_plot
from evals.routing_protocols import decision_latency, embed_latency, route_all, route_learned
from evals.routing_registry import EXAMPLES, build_catalogue, sample_registry, scan_all


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tools", required=True, metavar="FILE",
                   help="catalogue: MCP tool objects, JSONL (e.g. the public routing data's tools.jsonl)")
    p.add_argument("--queries", required=True, metavar="FILE",
                   help='scored queries {"query", "gold_tool"}, JSONL (e.g. the public routing data\'s queries.jsonl)')
    p.add_argument("--irrelevant", default=None, metavar="FILE",
                   help="prompts with no fitting tool (expected route: none)")
    p.add_argument("--calib", default=None, metavar="FILE",
                   help="labelled queries to fit tau/floor/reranker (default: the --queries file)")
    p.add_argument("--sizes", default="10,50,100,250")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.97, help="auto-route precision target for tau")
    p.add_argument("--floor-recall", type=float, default=0.98, help="share of relevant calib queries above the floor")
    p.add_argument("--recipe", default="schema", help="tool text: schema | name_desc_params | name_desc")
    p.add_argument("--reranker", default=None,
                   help="a CrossEncoder folder to use instead of training one; 'none': no reranking (gate only)")
    p.add_argument("--train-steps", type=int, default=300,
                   help="reranker optimizer steps (per fold when cross-fitting)")
    p.add_argument("--max-queries", type=int, default=0, help="score only the first N queries (quick runs)")
    p.add_argument("--k", type=int, default=10, help="candidates reranked")
    p.add_argument("--plot", default=None, help="PNG path for accuracy vs size (default: next to --json)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--abstain", choices=("fitted", "floor"), default="floor",
                   help="none test: floor (top-1 cosine) | fitted (score + weight x margin, fitted with leave-gold-out "
                        "negatives; measured +1.4 points irrelevant -> none at 250 tools for +0.5 relevant -> none)")
    p.add_argument("--quantize", action="store_true", help="dynamic INT8 embedder for tools and queries")
    p.add_argument("--embedder", default=None,
                   help="a sentence-transformers model folder (default: the packaged all-MiniLM-L6-v2), to compare "
                        "encoders on the same registries (the cross-encoder is still trained from the packaged MiniLM)")
    p.add_argument("--timed", type=int, default=100, help="queries timed as whole decisions (decision_ms_*)")
    p.add_argument("--learn-cap", type=int, default=32, help="learned example rows kept per tool (top1_learned)")
    p.add_argument("--examples", choices=EXAMPLES, default="none",
                   help="templated example rows per tool (registry.examples, from schema fields): template | none "
                        "(measured: they lower top-1 under best-row scoring, so the router does not route on them)")


def check_files(args: argparse.Namespace) -> None:
    """FileNotFoundError naming the flag whose file is absent."""
    for flag in ("tools", "queries", "calib", "irrelevant"):
        path = getattr(args, flag)
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"--{flag} {path}: no such file")


def _jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def _fold(name: str) -> int:
    return hashlib.sha256(name.encode()).digest()[0] % 2


def _abstention(args, res, golds) -> tuple[float, float]:
    """(none_margin, floor) fitted on the scan results `res` of labelled queries (`--abstain`): "floor" keeps
    `--floor-recall` of their top-1 cosines above the floor (none_margin 0); "fitted" also scores each query
    with its gold tool left out (the registry's own no-tool negatives, slb.gate.leave_gold_out) and picks the
    margin weight that rejects most of those at the same recall (slb.gate.pick_abstention)."""
    import numpy as np

    from slb.gate import leave_gold_out, pick_abstention, pick_floor

    top1 = np.array([r[1][0] for r in res])
    margin = np.array([r[1][0] - r[1][1] if len(r[1]) > 1 else 1.0 for r in res])  # plain: the none test's
    if args.abstain == "floor" or min(len(r[1]) for r in res) < 3:
        return 0.0, pick_floor(top1, args.floor_recall)
    k = min(len(r[1]) for r in res)
    neg_top1, neg_margin = leave_gold_out(np.stack([r[1][:k] for r in res]), np.stack([r[2][:k] for r in res]),
                                          np.asarray(golds))
    return pick_abstention(top1, margin, neg_top1, neg_margin, args.floor_recall)


def _fit_weights(rr, texts, lexical, qtexts, qv, golds, cat, size, seed, k, limit=2000) -> dict:
    """Fusion weights fitted on (at most `limit`) calibration queries at registry size `size`:
    {"lex_weight", "ce_weight"} (with the cross-encoder, when there is one) and "lex_only" (ce_weight 0)."""
    import numpy as np

    from slb.gate import pick_fusion_weights

    if len(qtexts) == 0:
        return {"lex_weight": 0.0, "ce_weight": 0.0, "lex_only": 0.0}
    sel = np.random.default_rng(seed).permutation(len(qtexts))[:limit]
    res = scan_all(qv[sel], golds[sel], cat, size, seed + 104729, k)
    k_eff = min(len(r[1]) for r in res)
    cos = np.stack([r[1][:k_eff] for r in res])
    lex = np.stack([lexical.subset(r[3]).scores(qtexts[j], [int(np.flatnonzero(r[3] == c)[0]) for c in r[2][:k_eff]])
                    for j, r in zip(sel, res)])
    gold = np.array([int(np.flatnonzero(r[2][:k_eff] == g)[0]) if g in r[2][:k_eff] else -1
                     for r, g in zip(res, golds[sel])])
    lex_only = pick_fusion_weights(cos, lex, None, gold)[0]
    if rr is None:
        return {"lex_weight": lex_only, "ce_weight": 0.0, "lex_only": lex_only}
    logits = np.stack([rr.score(qtexts[j], [texts[i] for i in r[2][:k_eff]]) for j, r in zip(sel, res)])
    w, c = pick_fusion_weights(cos, lex, logits, gold)
    return {"lex_weight": w, "ce_weight": c, "lex_only": lex_only}


def run(args: argparse.Namespace) -> dict:
    check_files(args)  # before the heavy imports: a wrong path fails fast
    import numpy as np
    import torch

    from registry.atomic import write_atomic
    from registry.home import home_path
    from slb.embedder import PACKAGED_MODEL, Embedder, EmbedderConfig
    from slb.gate import GateConfig, gate_stats, none_score, pick_tau
    from slb.reranker import Reranker, registry_fingerprint
    from slb.scan import scan
    from slb.tools import as_entry

    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    tools = [as_entry(t) for t in _jsonl(args.tools)]
    names = [t.name for t in tools]
    pos = {n: i for i, n in enumerate(names)}
    scored = [q for q in _jsonl(args.queries) if q.get("gold_tool") in pos]
    if args.max_queries:
        scored = scored[: args.max_queries]
    scored_texts = {q["query"] for q in scored}
    calib_path = args.calib or args.queries
    calib = [q for q in _jsonl(calib_path) if q.get("gold_tool") in pos and q["query"] not in scored_texts]
    cross_fit = len(calib) < 20
    if cross_fit:  # thresholds for fold f come from the other fold of the scored set
        calib = []
    emb = Embedder(EmbedderConfig(model=args.embedder or PACKAGED_MODEL, recipe=args.recipe, quantize=args.quantize))
    t0 = time.perf_counter()
    model_tag = hashlib.sha256(emb.model_id.encode()).hexdigest()[:8]  # model, INT8 or not, and recipe
    cache = home_path("slb", "eval-cache", f"{registry_fingerprint(tools, args.recipe)}-{model_tag}.npy")
    f32 = np.load(cache) if cache.exists() else emb.embed_tools(tools)
    if not cache.exists():
        write_atomic(cache, lambda f: np.save(f, f32))  # a torn cache would be loaded on the next run
    cat = build_catalogue(emb, tools, f32, args.examples)
    embed_tools_s = time.perf_counter() - t0
    qv = emb.embed_texts([q["query"] for q in scored])
    golds = np.array([pos[q["gold_tool"]] for q in scored])
    folds = np.array([_fold(q["gold_tool"]) for q in scored])
    cv = emb.embed_texts([q["query"] for q in calib]) if calib else None
    cgolds = np.array([pos[q["gold_tool"]] for q in calib]) if calib else None
    irr = _jsonl(args.irrelevant) if args.irrelevant else []
    iv = emb.embed_texts([q["query"] for q in irr]) if irr else None

    # Reranker per fold: synthesized catalogue queries + labelled queries never scored in that fold (calib, or
    # when cross-fitting the other fold's queries).
    if cross_fit:
        labelled = {f: [(q["query"], q["gold_tool"]) for q, qf in zip(scored, folds) if qf != f] for f in (0, 1)}
    else:
        labelled = dict.fromkeys((0, 1), [(q["query"], q["gold_tool"]) for q in calib])
    train_s = None
    if args.reranker == "none":
        rr_paths = {}
    elif args.reranker:
        rr_paths = dict.fromkeys((0, 1), Path(args.reranker))
    else:
        rr_paths, train_s = _train_rerankers(tools, emb, labelled, args)
    loaded = {p: Reranker(p) for p in set(rr_paths.values())}
    rr = {f: loaded[rr_paths[f]] if rr_paths else None for f in (0, 1)}

    # fusion weights: fitted once at the largest size <= 250 on calibration queries (per fold when cross-fitting)
    from slb.lexical import LexicalIndex
    from slb.tools import lexical_text, tool_text

    texts = [tool_text(t, args.recipe) for t in tools]
    # per-tool term counts once; each registry is a subset (IDF over its tools)
    lexical = LexicalIndex([lexical_text(t) for t in tools])
    fit_size = max([s for s in sizes if s <= 250] or sizes[:1])
    if cross_fit:
        qtexts = [q["query"] for q in scored]
        weights = {f: _fit_weights(rr[f], texts, lexical, [qtexts[i] for i in np.flatnonzero(folds != f)],
                                   qv[folds != f], golds[folds != f], cat, fit_size, args.seed + f, args.k)
                   for f in (0, 1)}
    else:
        w = _fit_weights(rr[0], texts, lexical, [q["query"] for q in calib], cv, cgolds, cat, fit_size,
                         args.seed, args.k)
        weights = {0: w, 1: w}
    result = {"sizes": {}, "fusion_weights": weights, "fit_size": fit_size, "queries": len(scored),
              "irrelevant": len(irr), "calib_queries": len(calib),
              "cross_fit": cross_fit, "recipe": args.recipe, "seed": args.seed, "target": args.target,
              "reranker": {f: str(p) for f, p in rr_paths.items()} or None, "reranker_train_s": train_s,
              "embed_catalogue_s": embed_tools_s, "catalogue": len(tools), "examples": args.examples,
              "catalogue_rows": len(cat.f32), "embedder": emb.model_id,
              "duplicate_pairs": sum(len(d) for d in cat.dups.values()) // 2}
    print(f"{'N':>6} {'embed':>7} {'int8':>7} {'routed':>7} {'lexonly':>7} {'learned':>7} {'auto%':>6} {'autoP':>6} "
          f"{'none%':>6} {'rel>0':>6} {'p50ms':>7} {'p99ms':>7} {'tau':>6} {'floor':>6}")
    for size in sizes:
        res = scan_all(qv, golds, cat, size, args.seed + size, args.k)
        top1_f = np.array([r[0] for r in res]) == golds
        top1_8 = np.array([r[2][0] for r in res]) == golds
        margins = np.array([cat.margin(r[1], r[2]) for r in res])
        # thresholds per scored query: from calib, or from the other fold
        if cross_fit:
            gates = {}
            for f in (0, 1):
                o = folds != f
                nm, fl = _abstention(args, [r for r, oo in zip(res, o) if oo], golds[o])
                gates[f] = GateConfig(pick_tau(margins[o], top1_8[o], args.target), fl,
                                      args.k, weights[f]["lex_weight"], weights[f]["ce_weight"], nm)
            gate_of = [gates[f] for f in folds]
        else:
            cres = scan_all(cv, cgolds, cat, size, args.seed + 7919 + size, args.k)
            cm = np.array([cat.margin(r[1], r[2]) for r in cres])
            cc = np.array([r[2][0] for r in cres]) == cgolds
            nm, fl = _abstention(args, cres, cgolds)
            g = GateConfig(pick_tau(cm, cc, args.target), fl, args.k, weights[0]["lex_weight"],
                           weights[0]["ce_weight"], nm)
            gate_of = [g] * len(scored)
        # routed on the very registries the embed / INT8 columns were scored on (res[i][3])
        chosen: list = []
        routed, paths, lat = route_all(emb, scored, qv, golds, res, gate_of, folds, rr, tools, names, cat, lexical,
                                        chosen)
        # duplicate-aware: the chosen tool is the gold one or a near-duplicate of it (slb.duplicates)
        dup_ok = [c is not None and (pos[c] == g or pos[c] in cat.dups.get(int(g), {})) for c, g in zip(chosen, golds)]
        lex_gates = [dataclasses.replace(gg, lex_weight=weights[f]["lex_only"], ce_weight=0.0)
                     for gg, f in zip(gate_of, folds)]
        if all(a == b for a, b in zip(lex_gates, gate_of)):  # fitted ce_weight 0 and the same lex weight: identical
            routed_lex, lat_lex = routed, lat
        else:
            routed_lex, _, lat_lex = route_all(emb, scored, qv, golds, res, lex_gates, folds, rr, tools, names, cat,
                                                lexical)
        dec = decision_latency(emb, scored, res, gate_of, folds, rr, tools, cat, lexical, args.timed)
        learned = route_learned(emb, scored, qv, golds, res, gate_of, folds, rr, tools, names, cat, lexical,
                                 args.learn_cap)
        paths = np.array(paths)
        auto = paths == "auto"
        none_prec = None
        if irr:
            g = gates[0] if cross_fit else gate_of[0]  # fitted on relevant queries only, never on these prompts
            rng_i = np.random.default_rng(args.seed + 17 * size)
            nn = 0
            for q, v in zip(irr, iv):
                idx = sample_registry(rng_i, len(tools), None, size)
                m8_i, sc_i, _, rt_i = cat.registry(idx)
                s, _ = scan(m8_i, sc_i, v, 2, row_tool=rt_i)
                nn += bool(none_score(s[0], s[0] - s[1] if len(s) > 1 else 1.0, g.none_margin) < g.floor)
            none_prec = nn / len(irr)
        row = {
            "top1_embed": float(top1_f.mean()), "top1_int8": float(top1_8.mean()),
            "top1_routed": float(np.mean(routed)),
            "top1_routed_lex": float(np.mean(routed_lex)),
            "top1_learned": float(np.mean(learned)),
            "top1_routed_dup_aware": float(np.mean(dup_ok)),
            "auto_rate": float(auto.mean()),
            "auto_precision": float(np.array(routed)[auto].mean()) if auto.any() else None,
            "rerank_rate": float((paths == "rerank").mean()), "none_rate_relevant": float((paths == "none").mean()),
            "relevant_to_none": float((paths == "none").mean()),
            "none_precision": none_prec, "route_ms_p50": float(np.percentile(lat, 50)),
            "route_ms_p99": float(np.percentile(lat, 99)),
            "decision_ms_p50": float(np.percentile(dec, 50)) if dec else None,
            "decision_ms_p99": float(np.percentile(dec, 99)) if dec else None,
            "route_ms_p50_lex": float(np.percentile(lat_lex, 50)),
            "route_ms_p99_lex": float(np.percentile(lat_lex, 99)),
            "tau": float(np.mean([gg.tau for gg in gate_of])), "floor": float(np.mean([gg.floor for gg in gate_of])),
            "none_margin": float(np.mean([gg.none_margin for gg in gate_of])),
            "gate_stats_int8": gate_stats(margins, top1_8, float(np.mean([gg.tau for gg in gate_of]))),
        }
        result["sizes"][str(size)] = row
        print(f"{size:>6} {row['top1_embed']:7.3f} {row['top1_int8']:7.3f} {row['top1_routed']:7.3f} "
              f"{row['top1_routed_lex']:7.3f} {row['top1_learned']:7.3f} {row['auto_rate']*100:6.1f} "
              f"{(row['auto_precision'] or 0):6.3f} {(none_prec if none_prec is not None else float('nan'))*100:6.1f} "
              f"{row['relevant_to_none']*100:6.1f} {row['route_ms_p50']:7.2f} {row['route_ms_p99']:7.2f} "
              f"{row['tau']:6.3f} {row['floor']:6.3f}")
    embed_latency(emb, scored, result)
    plot = args.plot or (str(Path(args.json_out).with_suffix(".png")) if getattr(args, "json_out", None) else None)
    if plot:
        save_plot(FIGURES, result, plot)
        result["plot"] = plot
    return result


def _train_rerankers(tools, emb, labelled: dict, args) -> tuple[dict, float | None]:
    """fold -> reranker folder trained on `labelled[fold]` (reused from the Nexus home when tools, labelled
    set and config match; folds with the same labelled set share one) and the total training seconds (None
    when all were reused)."""
    from registry.home import home_path
    from slb.reranker import RerankerTrainConfig, registry_fingerprint, train_reranker, trained_for

    cfg = RerankerTrainConfig(max_steps=args.train_steps, seed=args.seed, threads=args.threads)
    paths, train_s = {}, None
    for f, lab in labelled.items():
        paths[f] = home_path("rerankers", f"eval-{registry_fingerprint(tools, args.recipe, lab)}-s{args.train_steps}")
        if not trained_for(paths[f], tools, args.recipe, lab, cfg):
            train_s = (train_s or 0.0) + train_reranker(tools, emb, paths[f], lab, cfg)["train_s"]
    return paths, train_s


def table(r: dict) -> str:
    """Markdown: per registry size, top-1 accuracy of each stage, the auto-route rate and precision, the share of
    irrelevant prompts routed to none, the route time after the query embedding and the whole decision's time."""

    def none_precision(s):  # null when the eval ran without --irrelevant
        v = s.get("none_precision")
        return "—" if v is None or v != v else pct(v)

    return md_table(["tools", "top-1 float32", "top-1 INT8", "top-1 routed", "top-1 routed (no CE)",
                     "top-1 learned (sequential)", "auto-routed", "auto precision", "irrelevant → none",
                     "relevant → none", "route p50 (ms)", "route p99 (ms)", "decision p50 (ms)", "decision p99 (ms)"],
                    [[n, pct(s["top1_embed"]), pct(s["top1_int8"]), pct(s["top1_routed"]),
                      pct(s.get("top1_routed_lex")), pct(s.get("top1_learned")), pct(s["auto_rate"]),
                      pct(s["auto_precision"]), none_precision(s), pct(s.get("relevant_to_none")), s["route_ms_p50"],
                      s.get("route_ms_p99"), s.get("decision_ms_p50"), s.get("decision_ms_p99")]
                     for n, s in sorted(r["sizes"].items(), key=lambda kv: int(kv[0]))])


def accuracy_figure(r: dict):
    """Top-1 routing accuracy (%) vs registry size (tools), float32 / INT8 embeddings and the full router."""
    sizes = sorted(int(s) for s in r.get("sizes", {}))
    if not sizes:
        return None
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for key, label, style in (("top1_embed", "embedding float32", "-"), ("top1_int8", "embedding INT8", "--"),
                              ("top1_routed", "gated + reranked router", "-"),
                              ("top1_learned", "router + learned examples (sequential)", ":")):
        if all(key in r["sizes"][str(s)] for s in sizes):
            ax.plot(sizes, [r["sizes"][str(s)][key] * 100 for s in sizes], style, marker="o", label=label)
    log_ticks(ax, sizes)
    ax.set(xlabel="registry size (tools, log scale)", ylabel="top-1 accuracy (%)",
           title="Routing accuracy vs registry size")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


FIGURES = (Figure("routing_accuracy.png", accuracy_figure),)
