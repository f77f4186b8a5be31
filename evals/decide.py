"""Who decides whether to call a tool and which: the router alone, or the model among the router's top k.

Items: relevant requests (`--queries`, each with its gold tool), prompts no tool fits (`--irrelevant`) and
conversational turns that need no tool (`--chat`, evals/data/chat_turns.jsonl). For every item and size N the
registry is the gold tool (if any) plus N-1 distractors drawn from `--tools` with a seeded RNG, sent as a
chat request's tools to the `nexus serve` engine in process (`nexus_agent.serve_engine.Engine`).

Variants, per model and size:
- `router`: today's router alone (the engine's router-only plan: gate, floor, fused order);
- `top{k}`: the model decides among the router's top k, shown as its template shows tools (schema text);
- `top{k}-sure{m}` (`--k-sure`, and the model's own setting): the same, but only the first m candidates when the
  router's gate is sure;
- `...-splice` (`--splice`): the same candidates spliced from their KV blocks (`turn.blocks`), with their fidelity
  to the variant prefilled as text (the same decision) and the prefill's speed-up;
- `all`: every tool in the prompt, as llama.cpp's and mlx-lm's servers serve tools (a prompt over the
  context, `--n-ctx`, is a failure: no decision);
- `nexus`: what `nexus serve` ships for the model: its decide profile (`nexus_agent.turn.profile`) applied;
  with `--history`, `nexus-one-reading` applies it to the whole conversation's p(call) alone (none read beside).

One model pass per item and variant (`decide_measure.measure`) measures everything a profile needs: the model's
probability of starting a call, and the log-probability of every candidate's name after the call opener. The
call/text rule and the name fusion are then applied to those numbers; with `--calibrate` they are fitted
(`decide_fit`: logistic weights, the threshold that loses at most `--max-lost` of relevant requests, the router
weight on names, and model vs router mode) and the `nexus` variant is scored 2-fold cross-fitted (each half with the
setting fitted on the other, split by a hash of the item); the setting fitted on all items is saved as the model's
profile.
call_ms: time to the complete call (arguments included) through the engine, on the first `--timed` relevant
items of each size. `--history` asks every item after fixed earlier turns (`decide_measure.HISTORIES`).
Scoring, splice fidelity and the cross-fitted calibration are `decide_score`'s; this module is the command.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from evals.decide_fit import with_values
from evals.decide_measure import HISTORIES, KINDS, items, jsonl, measure, registry, time_calls, variant
from evals.decide_report import FIGURES, table
from evals.decide_score import calibrate, neutral, row, score, splice_fidelity
from evals.render import save_plot

DEFAULT_CHAT = str(Path(__file__).with_name("data") / "chat_turns.jsonl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tools", required=True, metavar="FILE", help="catalogue: MCP tool objects, JSONL")
    p.add_argument("--queries", required=True, metavar="FILE", help='relevant requests {"query", "gold_tool"}, JSONL')
    p.add_argument("--irrelevant", default=None, metavar="FILE", help="prompts no tool fits, JSONL {query}")
    p.add_argument("--chat", default=DEFAULT_CHAT, metavar="FILE",
                   help="conversational turns that need no tool, JSONL {messages}")
    p.add_argument("--sizes", default="10,250,1000")
    p.add_argument("--model", default="qwen2.5-coder-0.5b",
                   help="comma-separated packaged names or GGUF paths (e.g. qwen2.5-coder-0.5b,smollm2)")
    p.add_argument("--ks", default="3,5,8", help="candidates shown to the model (top-k variants)")
    p.add_argument("--k-sure", default="", metavar="M[,M]",
                   help="also each top-k showing only the first M candidates when the router's gate is sure")
    p.add_argument("--all-tools", action="store_true", help="also the variant with every tool in the prompt")
    p.add_argument("--splice", action="store_true",
                   help="also each top-k with the candidates spliced from KV blocks (fidelity and prefill speed-up)")
    p.add_argument("--splice-head", type=int, default=None, metavar="N",
                   help="tokens of each spliced tool block recomputed after the splice (default: the shipped "
                        "`turn.blocks.DEFAULT_HEAD`)")
    p.add_argument("--relevant", type=int, default=60, help="relevant requests scored per size")
    p.add_argument("--n-irrelevant", type=int, default=30, help="irrelevant prompts scored per size")
    p.add_argument("--n-chat", type=int, default=60, help="conversational turns scored per size")
    p.add_argument("--timed", type=int, default=5, help="relevant items timed to the complete call per size")
    p.add_argument("--calibrate", action="store_true",
                   help="fit the decide profile (cross-fitted scores) and save it in the Nexus home")
    p.add_argument("--calibrate-k", type=int, default=5, help="the k the fitted profile shows the model")
    p.add_argument("--calibrate-k-sure", type=int, default=None, metavar="M",
                   help="the fitted profile shows M candidates when the router's gate is sure (0: k; default: the "
                        "model's current setting)")
    p.add_argument("--history", default=None, choices=sorted(HISTORIES),
                   help="ask every item after these earlier turns (a greeting exchange; two requests answered by "
                        "calls; the same and a text answer): p(call) is also read beside the conversation")
    p.add_argument("--name-weight", type=float, default=None, metavar="W",
                   help="the router's weight on candidate names, fixed instead of fitted")
    p.add_argument("--reading", action="store_true",
                   help="also fit the call-or-text rule on the model's final hidden state (`DecideProfile.reading`; "
                        "measurements record it where the backend reads it); README, \"Deciding\", says what it gained "
                        "held out for the 0.5B Qwen")
    p.add_argument("--max-lost", type=float, default=0.02, help="relevant requests the fitted rule may answer in text")
    p.add_argument("--n-ctx", type=int, default=32768, help="the engine's context (the all-tools variant needs it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="PNG path (default: next to --json)")
    p.add_argument("--dump", default=None, metavar="FILE",
                   help="write every item's measurements (JSON) to refit a profile without the model")
    p.add_argument("--refit", default=None, metavar="DUMP",
                   help="calibrate again from a --dump of a run whose JSON is at --json (no model pass); "
                        "several dumps (A,B: runs with other seeds) are pooled")
    p.add_argument("--rescore", default=None, metavar="DUMP",
                   help="score the shipped setting again on a --dump of a run whose JSON is at --json (no model "
                        "pass): the `nexus` rows of measurements taken before the setting changed")


def refit(args: argparse.Namespace) -> dict:
    """`--refit DUMP`: the calibration again from a run's measurements, without the model. The run's JSON (at
    --json) gives the router's metrics and the models' fingerprints; its `nexus` rows and profiles are rewritten
    and each profile is saved in the Nexus home. Several dumps (`A,B`) are pooled: the `nexus` rows then cover every
    pooled item (cross-fitted halves), and `--rescore` scores one run by a profile fitted on the others."""
    from nexus_agent.turn.profile import save_decide_profile

    if not getattr(args, "json_out", None) or not Path(args.json_out).is_file():
        raise SystemExit("nexus eval decide --refit DUMP needs --json OUT: the JSON the measured run wrote")
    out = json.loads(Path(args.json_out).read_text())
    dumps: dict = {}
    for path in args.refit.split(","):  # several runs (seeds): their measurements pooled
        for name, sizes in json.loads(Path(path).read_text()).items():
            for size, vs in sizes.items():
                for v, pairs in vs.items():
                    dumps.setdefault(name, {}).setdefault(size, {}).setdefault(v, []).extend(pairs)
    for name, sizes in dumps.items():
        per_size = {int(s): {"meas": {v: [(it, with_values(it, m)) for it, m in pairs] for v, pairs in vs.items()},
                             "res": out["sizes"][s][name]} for s, vs in sizes.items()}
        was = out["profiles"][name]
        profile = calibrate(args, per_size, out, name, was.get("k_sure", 0),
                             (was.get("splice_err", 0.0), was.get("splice_name_err", 0.0),
                              (was.get("reading") or {}).get("splice_err")))
        save_decide_profile(out["models"][name]["fingerprint"], profile)
        out["profiles"][name] = dict(vars(profile))
        for s in sizes:
            if profile.mode == "router":
                out["sizes"][s][name]["nexus"] = dict(out["sizes"][s][name]["router"], source="router")
    print(table(out))
    return out


def rescore(args: argparse.Namespace) -> dict:
    """`--rescore DUMP`: each model's `nexus` rows again, by the setting it ships now (or the one calibrated in
    the Nexus home), from a run's measurements; the run's JSON (at --json) is rewritten. The times to the
    complete call were taken with the earlier setting and are left out."""
    from nexus_agent.turn.profile import load_decide_profile

    if not getattr(args, "json_out", None) or not Path(args.json_out).is_file():
        raise SystemExit("nexus eval decide --rescore DUMP needs --json OUT: the JSON the measured run wrote")
    out = json.loads(Path(args.json_out).read_text())
    for name, sizes in json.loads(Path(args.rescore).read_text()).items():
        model = out["models"][name]
        profile = load_decide_profile(model["fingerprint"], model["template_tools"])
        out["profiles"][name] = dict(vars(profile))
        out.setdefault("rescored", {})[name] = profile.source
        for s, vs in sizes.items():
            res = out["sizes"][s][name]
            key = "all" if int(s) <= profile.fit_all and "all" in vs else variant(profile.k, profile.k_sure)
            if profile.mode == "router" or key not in vs:
                res["nexus"] = dict(res["router"], source="router")
            else:
                res["nexus"] = score([row(it, with_values(it, m), profile) for it, m in vs[key]])
            splice_fidelity(res, {v: [(it, with_values(it, m)) for it, m in pairs] for v, pairs in vs.items()},
                             profile)
    print(table(out))
    return out


def run(args: argparse.Namespace) -> dict:
    if args.refit:
        return refit(args)
    if args.rescore:
        return rescore(args)
    for f in (args.tools, args.queries, args.irrelevant, args.chat):
        if f and not Path(f).is_file():
            raise SystemExit(f"nexus eval decide: {f}: no such file")
    from nexus_agent.openai_api import ChatRequest
    from nexus_agent.serve_engine import Engine, EngineConfig
    from nexus_agent.turn.blocks import ToolBlocks
    from nexus_agent.turn.profile import load_decide_profile, save_decide_profile
    from nexus_agent.turn.retrieval import retrieve
    from registry.model import Tool

    catalogue = [Tool.from_mcp(t) for t in jsonl(args.tools)]
    sizes = [int(s) for s in args.sizes.split(",")]
    ks = [int(k) for k in args.ks.split(",") if k]
    asked_sures = {int(m) for m in args.k_sure.split(",") if m}
    scored = items(args, [t.name for t in catalogue])
    out: dict = {"sizes": {}, "profiles": {}, "items": {k: sum(i["kind"] == k for i in scored) for k in KINDS}}
    dumped: dict = {}
    for model in args.model.split(","):
        engine = Engine(EngineConfig(model=model, n_ctx=args.n_ctx))
        can = engine.backend.capabilities.can_splice and engine.decider.fmt.template_tools
        head = {} if args.splice_head is None else {"head": args.splice_head}
        blocks = ToolBlocks(engine.backend, **head) if args.splice and can else None
        shipped = load_decide_profile(engine.backend.info.fingerprint, engine.decider.fmt.template_tools)
        sures = sorted(asked_sures | ({shipped.k_sure} if shipped.k_sure else set()))  # what ships is measured
        name = engine.model_id
        out.setdefault("models", {})[name] = {"fingerprint": engine.backend.info.fingerprint,
                                              "template_tools": engine.decider.fmt.template_tools}
        per_size: dict[int, dict] = {}
        for size in sizes:
            rows: dict[str, list] = {"router": []}
            meas: dict[str, list] = {}
            for j, it in enumerate(scored):
                tools = registry(args.seed, j, size, catalogue, it["gold"])
                req = ChatRequest(model=name, messages=it["messages"], tools=tools)
                t0 = time.perf_counter()
                plan = engine.plan(req)
                route_ms = (time.perf_counter() - t0) * 1e3
                rows["router"].append({**it, "pick": plan[0][0].name if plan else None, "decide_ms": route_ms,
                                       "recall": bool(plan) and plan[0][0].name == it["gold"], "prompt_tokens": 0})
                variants = [(variant(k, m, bl is not None), k, 0, bl, m)
                            for bl in ([None] if blocks is None else [None, blocks])
                            for k in ks if k < size for m in [0, *(s for s in sures if s < k)]]
                if args.all_tools:
                    variants.append(("all", size, size, None, 0))
                sure = bool(sures) and retrieve(engine.router_for(req.tools), req.messages).path == "auto"
                for vname, k, fit_all, bl, k_sure in variants:
                    if k_sure and not sure:  # the gate is not sure: the same prompt as top{k}
                        meas.setdefault(vname, []).append(meas[variant(k, 0, bl is not None)][-1])
                        continue
                    try:
                        m = measure(engine, req, k, fit_all, bl, k_sure)
                    except Exception as e:  # an overflowing prompt is the variant's failure, not the eval's
                        if "context" not in str(e):
                            raise
                        m = None
                    meas.setdefault(vname, []).append((it, m))
                print(f"[decide] {name} N={size} item {j + 1}/{len(scored)}", flush=True)
            res = {"router": score(rows["router"])}
            for vname, pairs in meas.items():
                res[vname] = score([row(it, m, neutral(shipped)) for it, m in pairs])
            per_size[size] = {"res": res, "meas": meas}
            out["sizes"].setdefault(str(size), {})[name] = res
        if args.dump:
            dumped[name] = {str(s): {v: [[it, m] for it, m in pairs] for v, pairs in per_size[s]["meas"].items()}
                            for s in sizes}
        profile = shipped
        if args.calibrate:
            profile = calibrate(args, per_size, out, name, shipped.k_sure,
                                 (shipped.splice_err, shipped.splice_name_err,
                                  (shipped.reading or {}).get("splice_err")))
            path = save_decide_profile(engine.backend.info.fingerprint, profile)
            print(f"[decide] {name}: profile ({profile.mode}) saved to {path}")
        out["profiles"][name] = {k: v for k, v in vars(profile).items()}
        for size in sizes:
            res = out["sizes"][str(size)][name]
            key = "all" if size <= profile.fit_all and "all" in per_size[size]["meas"] else \
                variant(profile.k, profile.k_sure)
            if profile.mode == "router" or key not in per_size[size]["meas"]:
                res["nexus"] = dict(res["router"], source="router")
            elif "nexus" not in res:
                res["nexus"] = score([row(it, m, profile) for it, m in per_size[size]["meas"][key]])
                if getattr(args, "history", None):  # the same setting on the conversation's own reading alone
                    res["nexus-one-reading"] = score([row(it, m and dict(m, p_beside=[]), profile)
                                                      for it, m in per_size[size]["meas"][key]])
            splice_fidelity(res, per_size[size]["meas"], profile)
        time_calls(engine, profile, scored, sizes, catalogue, args, out, name)
        engine.close()
    if args.dump:
        from registry.atomic import write_atomic

        write_atomic(args.dump, json.dumps(dumped))
    plot = args.plot or (str(Path(args.json_out).with_suffix(".png")) if getattr(args, "json_out", None) else None)
    if plot and save_plot(FIGURES, out, plot):
        out["plot"] = plot
    print(table(out))
    return out
