"""Argument accuracy on real BFCL requests (`../shared/data/arguments/`), scored by BFCL's AST-checker rules.

Per item, in one process on one model:
- gold tool given (isolates the argument generator), three variants:
  - `free`: the tool's full JSON schema in the prompt and free greedy generation, the first JSON object of
    the reply taken as the arguments (the way BFCL prompts a model);
  - `constrained`: the agent's own argument path (compressed signature, full schema when needed or after a
    failed validation) under llguidance's schema grammar, without copying (`copy_bias` 0);
  - `nexus`: the same path with copy-aware decoding (`copy_bias`, nexus_agent.arguments.copying).
- routed (end to end): the gold tool, the tools BFCL offered with it, and catalogue distractors make a
  registry of N tools; the SLB scan (embed mode: its top-1) picks one; `nexus` arguments for it.
  An item counts when the routed tool is the gold one and its arguments score.

`copyable_share` is the share of items whose required values are all written in the request (a boolean
never is): the ceiling of pure copying, reported beside the scores. Nothing here is tuned to the public items;
`--data` takes any file in the same format.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from pathlib import Path

from evals.render import Figure, md_table, pct, pyplot
from native.registry import list_backends

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "arguments" / "arguments.jsonl"
CATALOG = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing" / "tools.jsonl"
VARIANTS = ("free", "constrained", "nexus")
N_CTX = 8192
FREE_SYSTEM = ("You are an expert in composing function calls. You are given a question and a function in JSON "
               "format. Reply with only the JSON object of the function's arguments.\n\nFunction:\n{tool}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from nexus_agent.arguments.copying import DEFAULT_BIAS

    p.add_argument("--data", default=str(DATA), metavar="FILE", help="items in the BFCL arguments format")
    p.add_argument("--backend", choices=list_backends(text_only=False), default="llamacpp")
    p.add_argument("--model", default=None, help="GGUF file, MLX folder or packaged model name")
    p.add_argument("--per-category", type=int, default=0, metavar="N",
                   help="at most N items per category, drawn with --seed (default 0: all)")
    p.add_argument("--sizes", default="250", help="registry sizes for the routed variant ('' for none)")
    p.add_argument("--catalog", default=str(CATALOG), metavar="FILE", help="JSONL of distractor tools")
    p.add_argument("--bias", type=float, default=DEFAULT_BIAS, help="copy bias of the nexus variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help="gold-tool variants to run")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="8 items per category, routed at 250 (~6 min)")


def load_items(path: str, per_category: int = 0, seed: int = 0) -> list[dict]:
    """The items of `path` (JSONL), at most `per_category` per category (a seeded sample) when > 0."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--data {path}: no such file")
    items = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        missing = [k for k in ("id", "query", "tool", "possible_answer") if k not in item]
        if missing:
            raise ValueError(f"{path}:{n}: item lacks {', '.join(missing)}")
        item.setdefault("category", "all")
        item.setdefault("offered_with", [])
        items.append(item)
    if per_category > 0:
        by_cat = defaultdict(list)
        for it in items:
            by_cat[it["category"]].append(it)
        rng = random.Random(seed)
        items = [it for cat in sorted(by_cat) for it in
                 (rng.sample(by_cat[cat], per_category) if len(by_cat[cat]) > per_category else by_cat[cat])]
    return items


def first_json_object(text: str):
    """The first balanced {...} of `text` parsed, or None; a {"name", "arguments"|"parameters"} wrapper is
    unwrapped (models often answer with the whole call)."""
    start = text.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(text)):
            c = text[i]
            if in_str:
                esc = (c == "\\") and not esc
                if c == '"' and not esc:
                    in_str = False
                elif c != "\\":
                    esc = False
                continue
            if c == '"':
                in_str = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    try:
                        value = json.loads(text[start:i + 1])
                    except ValueError:
                        break
                    for key in ("arguments", "parameters"):
                        if isinstance(value.get(key), dict) and len(value) <= 2:
                            return value[key]
                    return value
        start = text.find("{", start + 1)
    return None


def _json_closed(text: str) -> bool:
    return first_json_object(text) is not None


def _cold(live) -> None:
    if live.session.n_past:
        live.session.remove(0, live.session.n_past)
    live.ids = []


def _free(agent, tool, query: str, max_tokens: int) -> dict | None:
    """Free greedy generation with the full schema in the prompt; stops once a JSON object is complete."""
    from native.generate import stream_generate

    spec = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}
    messages = [{"role": "system", "content": FREE_SYSTEM.format(tool=json.dumps(spec))},
                {"role": "user", "content": query}]
    ids = agent.backend.tokenizer.encode_chat(messages)
    if len(ids) + max_tokens > N_CTX:
        return None
    _cold(agent.live)
    logits = agent.live.prefill(ids)
    text = ""
    for r in stream_generate(agent.backend, ids, max_tokens, session=agent.live.session, logits=logits):
        text += r.text
        if "}" in r.text and _json_closed(text):
            break
    _cold(agent.live)
    return first_json_object(text)


def _ours(agent, tool, query: str, bias: float) -> dict | None:
    from nexus_agent.arguments.copy_sources import Source

    agent.config.copy_bias = bias
    _cold(agent.live)
    args = agent.arguments(tool, query, [], [Source("request", query)]).arguments
    agent.trace.events.clear()
    return args


def _tool(spec: dict):
    from registry.model import Tool

    return Tool.from_mcp(spec)


def run(args: argparse.Namespace) -> dict:
    from evals.bfcl import copyable, score

    per_cat = 8 if args.quick else args.per_category
    items = load_items(args.data, per_cat, args.seed)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"--variants: unknown {', '.join(sorted(unknown))}; choose from {', '.join(VARIANTS)}")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if sizes and not Path(args.catalog).is_file():
        raise FileNotFoundError(f"--catalog {args.catalog}: no such file")

    import numpy as np

    from native import load_backend
    from nexus_agent.loop import Agent, AgentConfig
    from nexus_agent.servers import ServerPool

    backend = load_backend(args.backend, args.model)
    agent = Agent(backend, None, {}, ServerPool({}, {}), AgentConfig(n_ctx=N_CTX, answer=False,
                                                                      max_arg_tokens=args.max_tokens))
    routed_ctx = _routing_context(args.catalog, sizes) if sizes else None
    rows = []
    t_start = time.perf_counter()
    for k, item in enumerate(items):
        try:
            gold = _tool(item["tool"])
        except ValueError as e:
            rows.append({"id": item["id"], "category": item["category"], "skipped": str(e)})
            continue
        row = {"id": item["id"], "category": item["category"],
               "copyable": copyable(item["query"], item["possible_answer"])}
        for v in variants:
            got = (_free(agent, gold, item["query"], args.max_tokens) if v == "free"
                   else _ours(agent, gold, item["query"], 0.0 if v == "constrained" else args.bias))
            ok, why = score(got, item["possible_answer"], gold.input_schema)
            row[v] = {"ok": ok, "why": why, "arguments": got}
        for n in sizes:
            routed = _route(routed_ctx, item, gold, n, np.random.default_rng(args.seed + n + k))
            got = _ours(agent, routed, item["query"], args.bias) if routed.name == gold.name else None
            ok, why = score(got, item["possible_answer"], gold.input_schema) if got is not None else (
                False, f"routed to {routed.name}")
            row[f"routed_{n}"] = {"ok": ok, "why": why, "tool": routed.name}
        rows.append(row)
        done = k + 1
        if done % 10 == 0 or done == len(items):
            el = time.perf_counter() - t_start
            print(f"  {done}/{len(items)} items · {el:.0f} s · ~{el / done * (len(items) - done):.0f} s left",
                  flush=True)
    agent.live.close()
    backend.close()
    result = _summary(rows, variants, sizes)
    result.update(backend=args.backend, model=args.model or "packaged default", data=str(args.data),
                  bias=args.bias, per_category=per_cat, seed=args.seed, rows=rows)
    _print_table(result)
    return result


class _RoutingContext:
    def __init__(self, emb, tools, f32):
        self.emb, self.tools, self.f32 = emb, tools, f32


def _routing_context(catalog: str, sizes: list[int]):
    from registry.sources import load_tool_file
    from slb.embedder import Embedder
    from slb.tools import as_entry

    tools = []
    for spec in load_tool_file(catalog):
        try:
            tools.append(_tool(spec))
        except ValueError:
            continue
        if len(tools) >= max(sizes):
            break
    emb = Embedder()
    return _RoutingContext(emb, tools, emb.embed_tools([as_entry(t) for t in tools]))


def _route(ctx, item: dict, gold, size: int, rng):
    """The tool the SLB scan picks for the item's query among gold + offered + catalogue distractors."""
    import numpy as np

    from slb.buffer import quantize_rows
    from slb.index import ScanIndex
    from slb.router import Router
    from slb.tools import as_entry

    own = [gold]
    for spec in item.get("offered_with") or []:
        try:
            own.append(_tool(spec))
        except ValueError:
            continue
    names = {t.name for t in own}
    pool = [i for i in rng.permutation(len(ctx.tools)) if ctx.tools[i].name not in names][: max(size - len(own), 0)]
    tools = own + [ctx.tools[i] for i in pool]
    f32 = np.concatenate([ctx.emb.embed_tools([as_entry(t) for t in own]), ctx.f32[pool]]) if pool else \
        ctx.emb.embed_tools([as_entry(t) for t in own])
    m8, sc = quantize_rows(f32)
    router = Router(ctx.emb, ScanIndex(m8, sc), [as_entry(t) for t in tools], mode="embed")
    d = router.route(item["query"])
    return next(t for t in tools if t.name == d.tool) if d.tool else gold.model_copy(update={"name": "(none)"})


def _acc(rows: list[dict], key: str) -> dict:
    scored = [r for r in rows if key in r]
    cats = defaultdict(list)
    for r in scored:
        cats[r["category"]].append(r[key]["ok"])
    return {"overall": sum(r[key]["ok"] for r in scored) / len(scored) if scored else None,
            "items": len(scored),
            "categories": {c: sum(v) / len(v) for c, v in sorted(cats.items())}}


def _summary(rows: list[dict], variants: list[str], sizes: list[int]) -> dict:
    scored = [r for r in rows if "skipped" not in r]
    return {
        "gold_tool": {v: _acc(scored, v) for v in variants},
        "routed": {str(n): {"nexus": _acc(scored, f"routed_{n}")} for n in sizes},
        "copyable_share": sum(r["copyable"] for r in scored) / len(scored) if scored else None,
        "items": len(scored), "skipped": len(rows) - len(scored),
    }


def _columns(r: dict) -> list[tuple[str, dict]]:
    cols = [(v, s) for v, s in r["gold_tool"].items()]
    cols += [(f"routed@{n}", s["nexus"]) for n, s in r["routed"].items()]
    return cols


def _print_table(r: dict) -> None:
    cols = _columns(r)
    cats = sorted({c for _, s in cols for c in s["categories"]})
    print(f"argument accuracy · {r['items']} items · {r['backend']} · copy bias {r['bias']:g} · "
          f"copyable share {r['copyable_share']:.1%}")
    print(f"{'category':<16}" + "".join(f"{name:>14}" for name, _ in cols))
    for c in cats:
        print(f"{c:<16}" + "".join(f"{s['categories'].get(c, float('nan')):>14.1%}" for _, s in cols))
    print(f"{'overall':<16}" + "".join(f"{s['overall']:>14.1%}" for _, s in cols))


def table(r: dict) -> str:
    """Markdown: accuracy per category (rows) and variant (columns)."""
    cols = _columns(r)
    cats = sorted({c for _, s in cols for c in s["categories"]})
    rows = [[c] + [pct(s["categories"].get(c)) for _, s in cols] for c in cats]
    rows.append(["**overall**"] + [pct(s["overall"]) for _, s in cols])
    note = (f"\n\n{r['items']} items; copy bias {r['bias']:g}; copyable share (every required value written in "
            f"the request) {pct(r['copyable_share'])}.")
    return md_table(["category"] + [name for name, _ in cols], rows) + note


def figure(r: dict):
    """Accuracy per category, one bar per variant."""
    cols = _columns(r)
    if not cols:
        return None
    cats = sorted({c for _, s in cols for c in s["categories"]}) + ["overall"]
    fig, ax = pyplot().subplots(figsize=(11, 4.5))
    w = 0.8 / len(cols)
    for j, (name, s) in enumerate(cols):
        vals = [s["categories"].get(c, 0) if c != "overall" else s["overall"] for c in cats]
        ax.bar([i + (j - (len(cols) - 1) / 2) * w for i in range(len(cats))], vals, w, label=name)
    ax.axhline(r["copyable_share"], color="grey", ls="--", lw=1, label="copyable share")
    ax.set_xticks(range(len(cats)), cats, rotation=15)
    ax.set(ylabel="BFCL AST accuracy", ylim=(0, 1), title="Argument accuracy: free vs constrained vs copy-aware")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, ncol=len(cols) + 1)
    return fig


FIGURES = (Figure("arguments.png", figure),)
