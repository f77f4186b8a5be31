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

One model pass per item and variant measures everything a profile needs: the model's probability of starting a
call, and the log-probability of every candidate's name after the call opener. The call/text rule and the
name fusion are then applied to those numbers; with `--calibrate` they are fitted (logistic weights, the
threshold that loses at most `--max-lost` of relevant requests, the router weight on names, and model vs
router mode) and the `nexus` variant is scored 2-fold cross-fitted (each half with the setting fitted on the
other, split by a hash of the item); the setting fitted on all items is saved as the model's profile.
call_ms: time to the complete call (arguments included) through the engine, on the first `--timed` relevant
items of each size. `--history` asks every item after fixed earlier turns (`HISTORIES`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

from evals.decide_fit import apply, fit, rechecked_pick, splice_reach, with_values
from evals.decide_report import FIGURES, table
from evals.render import save_plot

DEFAULT_CHAT = str(Path(__file__).with_name("data") / "chat_turns.jsonl")


def called_turns(k: int, name: str, arguments: dict, result: dict) -> list[dict]:
    """An assistant turn calling `name` with `arguments` (call id h`k`), then the tool turn holding `result`."""
    return [{"role": "assistant", "content": "", "tool_calls": [{"id": f"h{k}", "type": "function", "function": {
                "name": name, "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": f"h{k}", "content": json.dumps(result)}]


_CALLS = ([{"role": "user", "content": "What's the weather in Oslo right now?"}]
          + called_turns(1, "get_weather", {"city": "Oslo"}, {"temperature_c": 3, "sky": "cloudy"})
          + [{"role": "user", "content": "And convert 100 USD to EUR."}]
          + called_turns(2, "convert_currency", {"amount": 100, "from": "USD", "to": "EUR"}, {"amount": 92.4}))
HISTORIES = {  # --history: earlier turns every item is asked after (their tools need not be in the registry)
    "greeting": [{"role": "user", "content": "Hi there!"},
                 {"role": "assistant", "content": "Hello! How can I help you today?"}],
    "calls": _CALLS,
    "answered": _CALLS + [{"role": "assistant", "content": "100 USD is 92.40 EUR; Oslo is at 3 °C and cloudy."}],
}
KINDS = ("relevant", "irrelevant", "chat")
FIT_ALL = 10  # a registry this small is shown whole


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


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _half(text: str) -> int:
    return hashlib.sha256(text.encode()).digest()[0] & 1


def items(args, names: list[str]) -> list[dict]:
    """The scored items: {kind, messages, gold (relevant only), key}, a seeded sample of each kind."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    pos = set(names)
    rel = [q for q in _jsonl(args.queries) if q.get("gold_tool") in pos]
    irr = _jsonl(args.irrelevant) if args.irrelevant else []
    chat = _jsonl(args.chat) if args.chat else []

    def pick(rows, n):
        return [rows[i] for i in sorted(rng.choice(len(rows), min(n, len(rows)), replace=False))] if rows else []

    out = [{"kind": "relevant", "gold": q["gold_tool"], "messages": [{"role": "user", "content": q["query"]}]}
           for q in pick(rel, args.relevant)]
    out += [{"kind": "irrelevant", "gold": None, "messages": [{"role": "user", "content": q["query"]}]}
            for q in pick(irr, args.n_irrelevant)]
    out += [{"kind": "chat", "gold": None, "messages": c["messages"]} for c in pick(chat, args.n_chat)]
    for it in out:
        it["messages"] = HISTORIES.get(getattr(args, "history", None), []) + it["messages"]
        it["key"] = json.dumps(it["messages"], ensure_ascii=False)
    return out


def registry(rng_seed: int, catalogue: list, gold: str | None, size: int) -> list:
    """The item's tools: its gold tool (if any) at a seeded position among size-1 seeded distractors."""
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    names = [t.name for t in catalogue]
    g = names.index(gold) if gold is not None else None
    pool = [i for i in rng.permutation(len(catalogue))[: size + 1] if i != g][: size - (g is not None)]
    if g is not None:
        pool.insert(int(rng.integers(0, len(pool) + 1)), g)
    return [catalogue[i] for i in pool]


def variant(k: int, k_sure: int = 0, splice: bool = False) -> str:
    """A top-k variant's name: `top{k}`, `-sure{k_sure}` when the gate's sureness narrows it, `-splice`."""
    return f"top{k}" + (f"-sure{k_sure}" if k_sure else "") + ("-splice" if splice else "")


def measure(engine, req, k: int, fit_all: int, blocks=None, k_sure: int = 0) -> dict:
    """One model pass: p_call (and beside it, `p_beside`: on each of `engine.readings`), every candidate's name
    log-probability, the router's evidence, timings.

    Every pass starts from a context holding the prompt's head (system text and tools preamble, which any
    earlier request leaves cached), so text and spliced variants pay for the same tokens. `blocks`: a
    `ToolBlocks` to splice the candidates from (their blocks compiled first, after the head, in a scratch
    session: `nexus compile`'s canonical place, never this prompt's own context)."""
    from nexus_agent.turn.profile import DecideProfile

    dec = engine.decider
    kept = dec.profile, dec.blocks, dec.all_names  # restored after: the router rows and the timed calls use them
    dec.profile = DecideProfile(mode="model", k=k, k_sure=k_sure, fit_all=fit_all, bias=1e6)  # always the names
    dec.blocks = blocks
    dec.all_names = True  # every candidate's log-probability: variants are scored from them offline
    try:
        return _measured(engine, req, blocks)
    finally:
        dec.profile, dec.blocks, dec.all_names = kept


def _measured(engine, req, blocks) -> dict:
    """`measure`'s pass, on the decider as `measure` set it."""
    from nexus_agent.turn.decide import top_k
    from nexus_agent.turn.engine import decision_prompt, reading_prompts
    from nexus_agent.turn.retrieval import retrieve

    by_name = {t.name: t for t in req.tools}
    profile = engine.decider.profile
    cands = top_k(retrieve(engine.router_for(req.tools), req.messages, profile.k), by_name, profile, len(req.tools))
    ids, spans = decision_prompt(engine.decider, req.messages, cands)
    head = spans[0][0] if spans else 0
    for live in engine.contexts:  # keep only the shared head cached
        n = min(head, len(live.ids))
        live.session.remove(n, live.session.n_past)
        live.ids = live.ids[:n]
    if blocks is not None and spans:
        blocks.compile(ids[:head], [ids[a:b] for a, b in spans])
    t0 = time.perf_counter()
    d = engine.decide(req, arguments=lambda tool, live, at, logits: (None, "not decoded", "")).decision
    ms = (time.perf_counter() - t0) * 1e3
    live = engine.contexts[-1]  # the context the decision was made on
    beside = [engine.decider.p_call_beside(live, ids, alt)
              for alt in reading_prompts(engine.decider, req.messages, cands)]
    return {"p_call": d.p_call, "p_beside": beside, "values": d.values, "lps": d.name_logprobs, "cands": d.candidates,
            "scores": d.scores, "top1": d.top1, "margin": d.margin, "prompt_tokens": d.prompt_tokens,
            "decide_ms": d.decide_ms, "prefill_ms": d.prefill_ms, "spliced": d.spliced, "ms": ms}


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
        profile = _calibrate(args, per_size, out, name, was.get("k_sure", 0),
                             (was.get("splice_err", 0.0), was.get("splice_name_err", 0.0)))
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
                res["nexus"] = score([_row(it, with_values(it, m), profile) for it, m in vs[key]])
            _splice_fidelity(res, {v: [(it, with_values(it, m)) for it, m in pairs] for v, pairs in vs.items()},
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

    catalogue = [Tool.from_mcp(t) for t in _jsonl(args.tools)]
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
                tools = registry(args.seed * 100003 + j * 7 + size, catalogue, it["gold"], size)
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
                res[vname] = score([_row(it, m, _neutral(shipped)) for it, m in pairs])
            per_size[size] = {"res": res, "meas": meas}
            out["sizes"].setdefault(str(size), {})[name] = res
        if args.dump:
            dumped[name] = {str(s): {v: [[it, m] for it, m in pairs] for v, pairs in per_size[s]["meas"].items()}
                            for s in sizes}
        profile = shipped
        if args.calibrate:
            profile = _calibrate(args, per_size, out, name, shipped.k_sure,
                                 (shipped.splice_err, shipped.splice_name_err))
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
                res["nexus"] = score([_row(it, m, profile) for it, m in per_size[size]["meas"][key]])
                if getattr(args, "history", None):  # the same setting on the conversation's own reading alone
                    res["nexus-one-reading"] = score([_row(it, m and dict(m, p_beside=[]), profile)
                                                      for it, m in per_size[size]["meas"][key]])
            _splice_fidelity(res, per_size[size]["meas"], profile)
        _time_calls(engine, profile, scored, sizes, catalogue, args, out, name)
        engine.close()
    if args.dump:
        from registry.atomic import write_atomic

        write_atomic(args.dump, json.dumps(dumped))
    plot = args.plot or (str(Path(args.json_out).with_suffix(".png")) if getattr(args, "json_out", None) else None)
    if plot and save_plot(FIGURES, out, plot):
        out["plot"] = plot
    print(table(out))
    return out


FAILED = "<failed>"  # the pick of an item the variant could not decide (its prompt overflowed the context)


def _row(it: dict, m: dict | None, profile) -> dict:
    if m is None:  # neither a call nor a text answer: wrong for every kind, counted in "failed"
        return {**it, "pick": FAILED, "failed": True}
    return {**it, "pick": apply(profile, m), "recall": it["gold"] in m["cands"], "decide_ms": m["decide_ms"],
            "prefill_ms": m["prefill_ms"], "prompt_tokens": m["prompt_tokens"]}


def _neutral(profile):
    """The model's own decision: p(call) > 0.5 and its likeliest name (the profile's order offsets, veto and
    splice reach kept)."""
    return replace(profile, mode="model", bias=0.0, w_model=1.0, w_top1=0.0, w_margin=0.0, w_values=0.0,
                   name_weight=0.0)


def _splice_fidelity(res: dict, meas: dict, profile) -> None:
    """Each spliced variant's fidelity to the same candidates prefilled as text (`_fidelity`), with `profile`'s
    splice reach: decided by the model alone (`_neutral`; keys without a suffix) and by `profile` (`_nexus`)."""
    for vname, pairs in meas.items():
        text = meas.get(vname.removesuffix("-splice"))
        if vname.endswith("-splice") and text and vname in res:
            res[vname].update(_fidelity(pairs, text, _neutral(profile)))
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


def _calibrate(args, per_size: dict, out: dict, name: str, k_sure: int = 0, reach: tuple = (0.0, 0.0)):
    """Fit the profile on every size's top-k measurements (cross-fitted `nexus` scores per size), return the
    profile fitted on all of them. `k_sure`: the model's current setting, kept unless --calibrate-k-sure says;
    `reach`: its (splice_err, splice_name_err), measured again where the run spliced (`splice_reach`)."""
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
            prof = fit(train, router_acc, args.max_lost, k, FIT_ALL, getattr(args, "name_weight", None))
            rows += [_row(it, m, prof) if prof.mode == "model" else None
                     for it, m in s["meas"][key] if _half(it["key"]) == half]
        if all(r is not None for r in rows):
            timed = out["sizes"][str(size)][name].get("nexus", {}).get("call_ms_p50")  # kept by a refit
            out["sizes"][str(size)][name]["nexus"] = dict(score(rows), call_ms_p50=timed)
    pairs = [(a, b) for s in per_size.values() for v, ms in s["meas"].items() if v.endswith("-splice")
             for (_, a), (_, b) in zip(ms, s["meas"].get(v.removesuffix("-splice"), []))]
    err, name_err = splice_reach(pairs) if pairs else reach
    return replace(fit(pooled, router_acc, args.max_lost, k, FIT_ALL, getattr(args, "name_weight", None)), k_sure=sure,
                   splice_err=err, splice_name_err=name_err)


def _router_acc(per_size: dict) -> float:
    accs = [s["res"]["router"]["decision_acc"] for s in per_size.values()]
    return float(sum(accs) / len(accs)) if accs else 0.0


def _time_calls(engine, profile, scored, sizes, catalogue, args, out, name) -> None:
    """call_ms_p50 of the shipped decision (`nexus`) and of the router through the engine's whole request path."""
    from nexus_agent.openai_api import ChatRequest

    rel = [(j, it) for j, it in enumerate(scored) if it["kind"] == "relevant"][: args.timed]
    for size in sizes:
        for variant, prof in (("nexus", profile), ("router", replace(profile, mode="router"))):
            engine.decider.profile = prof
            times = []
            for j, it in rel:
                tools = registry(args.seed * 100003 + j * 7 + size, catalogue, it["gold"], size)
                req = ChatRequest(model=name, messages=it["messages"], tools=tools)
                t0 = time.perf_counter()
                engine.run(req, lambda ev: None, lambda: False)
                times.append((time.perf_counter() - t0) * 1e3)
            if times:
                import numpy as np

                out["sizes"][str(size)][name][variant]["call_ms_p50"] = float(np.median(times))
    engine.decider.profile = profile
