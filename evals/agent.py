"""Agent argument generation vs the concatenate-all-schemas baseline, at registries of 10 and 250 tools.

Tools: every tool of the bundled servers (listed from the real servers), plus catalogue tools as distractors
for the larger registry. For each task and size N the registry is the gold tool plus N−1 distractors (bundled
first, then catalogue, seeded). The router is the SLB router over that registry as `nexus run` uses it (gate:
the scan's top-1 when its margin is clear, else cosine fused with BM25; no "none" floor, no cross-encoder),
over each tool's text row and its templated example rows as registration stores them (`--examples none`:
text rows only); arguments come from the agent's own path (`Agent.call_step` without the MCP call): compact
signature prompt, llguidance-constrained, copy-aware decoding, jsonschema, full-schema retry. Multi-step tasks
(`evals.agent_tasks.make_multi_tasks`) run whole turns on the real bundled servers:
each later step must call its tool with the value an earlier call returned.

Per size: routing_acc (routed tool == gold), json_valid (the produced arguments parse and validate against the
routed tool's schema, over tasks that produced any), args_exact (gold tool and gold arguments), ttfat_ms
(median request → first argument token: routing + cold prefill of the compact prompt + first constrained step),
context_tokens (median main-context prompt tokens), and the baseline: every registry schema in the prompt,
decoding the gold tool's arguments on the same backend in the same process from a cold cache. Baseline fields
are null where its prompt does not fit the 8192-token context (`baseline_prompt_tokens` shows by how much).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from evals.render import Figure, md_table, pct, pyplot
from native.registry import list_backends

N_CTX = 8192


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=list_backends(text_only=False), default="llamacpp")
    p.add_argument("--sizes", default="10,250")
    p.add_argument("--tasks", type=int, default=120, help="tasks per size (default 120)")
    p.add_argument("--baseline-tasks", type=int, default=6, help="tasks per size also run on the baseline")
    p.add_argument("--quick", action="store_true", help="30 tasks and 3 baseline tasks per size (~5 min)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--catalog", required=True, metavar="FILE",
                   help="JSONL of MCP tools used as distractors (e.g. the public routing catalogue tools.jsonl)")
    p.add_argument("--multi-tasks", type=int, default=None, metavar="N",
                   help="multi-step tasks per size, run end to end on the real bundled servers (default 20; "
                        "--quick 8)")
    p.add_argument("--copy-bias", type=float, default=None, help="copy bias (default: the agent's)")
    p.add_argument("--examples", choices=("template", "none"), default="template",
                   help="example rows per tool in the router, as registration stores them (default template)")


def _bundled_tools():
    from registry.client import list_server_tools
    from registry.model import Tool
    from registry.servers import BUNDLED, command_for

    out = []
    for name in BUNDLED:
        if name == "catalog":
            continue
        server, tools = list_server_tools(command_for(name))
        out += [Tool.from_mcp(t, server=server) for t in tools]
    return out


def _catalog_tools(path: str, exclude: set[str], limit: int = 600):
    from registry.model import Tool
    from registry.sources import load_tool_file

    out = []
    for t in load_tool_file(path):
        if t.get("name") in exclude:
            continue
        try:
            out.append(Tool.from_mcp(t))
        except Exception:
            continue  # a catalogue tool the registry would reject is not a distractor either
        if len(out) >= limit:
            break
    return out


def _registry(rng, gold: int, bundled: int, total: int, size: int) -> list[int]:
    """Tool indices: gold + distractors (other bundled tools first, then catalogue tools), shuffled."""
    others = [i for i in rng.permutation(bundled) if i != gold]
    extra = list(bundled + rng.permutation(total - bundled))
    idx = [gold] + (others + extra)[: size - 1]
    rng.shuffle(idx)
    return [int(i) for i in idx]


def _cold(live) -> None:
    if live.session.n_past:
        live.session.remove(0, live.session.n_past)
    live.ids = []


def _baseline(agent, tools, task_tool, request: str, max_tokens: int) -> tuple[float | None, int]:
    """(ms to the first argument token or None when the prompt overflows, prompt tokens)."""
    from nexus_agent.arguments.constrained import generate_json
    from nexus_agent.prompts import baseline_messages

    ids = agent.backend.tokenizer.encode_chat(baseline_messages(tools, request))
    if len(ids) + max_tokens > N_CTX:
        return None, len(ids)
    _cold(agent.live)
    t0 = time.perf_counter()
    logits = agent.live.prefill(ids)
    res = generate_json(agent.live.session, ids, task_tool.input_schema, agent.backend.tokenizer, 1, logits=logits)
    return (time.perf_counter() - t0 - res.total_s + res.ttft_s) * 1e3, len(ids)


def run(args: argparse.Namespace) -> dict:
    if not Path(args.catalog).is_file():  # before the heavy imports: a wrong path fails fast
        raise FileNotFoundError(f"--catalog {args.catalog}: no such file")
    import numpy as np

    from evals.agent_tasks import args_equal, make_tasks
    from evals.routing_registry import build_catalogue
    from native import load_backend
    from nexus_agent.loop import Agent, AgentConfig
    from nexus_agent.servers import ServerPool
    from slb.embedder import Embedder
    from slb.tools import as_entry

    n_tasks, n_base = (30, 3) if args.quick else (args.tasks, args.baseline_tasks)
    n_multi = args.multi_tasks if args.multi_tasks is not None else (8 if args.quick else 20)
    sizes = [int(s) for s in args.sizes.split(",")]
    bundled = _bundled_tools()
    names = {t.name for t in bundled}
    tools = bundled + _catalog_tools(args.catalog, names, max(sizes))
    by_name = {t.name: i for i, t in enumerate(tools)}
    tasks = [t for t in make_tasks(n_tasks, args.seed) if t.tool in by_name]
    emb = Embedder()
    entries = [as_entry(t) for t in tools]
    f32 = emb.embed_tools(entries)
    cat = build_catalogue(emb, tools, f32, args.examples)
    qv = emb.embed_texts([t.request for t in tasks])
    backend = load_backend(args.backend)
    config = AgentConfig(n_ctx=N_CTX, answer=False)
    if args.copy_bias is not None:
        config.copy_bias = args.copy_bias
    agent = Agent(backend, None, {t.name: t for t in tools}, ServerPool({}, {}), config)
    agent.pool.call = lambda tool, a: _NoCall(tool)  # single steps score arguments; multi-step tasks call
    result = {"backend": args.backend, "tasks": len(tasks), "seed": args.seed, "quick": bool(args.quick),
              "router": f"slb gate (scan top-1 or cosine + BM25, no none floor; examples: {args.examples})",
              "sizes": {}}
    for size in sizes:
        rng = np.random.default_rng(args.seed + size)
        rows = []
        for k, (task, q) in enumerate(zip(tasks, qv)):
            idx = _registry(rng, by_name[task.tool], len(bundled), len(tools), size)
            router = _router(emb, cat, entries, idx)
            t0 = time.perf_counter()
            d = router.route(task.request, q)
            route_ms = (time.perf_counter() - t0) * 1e3
            _cold(agent.live)
            call = agent.call_step(tools[by_name[d.tool]], task.request)
            ev = [e for e in agent.trace.of("args") if e["tool"] == d.tool][-1]
            gold_tool = tools[by_name[task.tool]]
            defaults = {p: s.get("default") for p, s in (gold_tool.input_schema.get("properties") or {}).items()
                        if isinstance(s, dict) and "default" in s}
            row = {"request": task.request, "gold": task.tool, "routed": d.tool, "arguments": call.arguments,
                   "valid": call.arguments is not None, "source": call.source,
                   "exact": d.tool == task.tool and args_equal(call.arguments, task.arguments, defaults),
                   "ttfat_ms": route_ms + call.ttfat_ms, "context_tokens": ev["prompt_tokens"]}
            if k < n_base:
                b_ms, b_tokens = _baseline(agent, [tools[i] for i in idx], gold_tool, task.request, 160)
                row.update(baseline_ms=b_ms, baseline_tokens=b_tokens)
            rows.append(row)
            agent.trace.events.clear()
        result["sizes"][str(size)] = _summary(rows)
        result["sizes"][str(size)]["rows"] = rows
        if n_multi:
            multi = _multi(agent, emb, tools, entries, cat, len(bundled), by_name, size, n_multi, args.seed)
            result["sizes"][str(size)].update(multi)
    result["copy_bias"] = agent.config.copy_bias
    agent.live.close()
    backend.close()
    _print_table(result)
    return result


def _multi(agent, emb, tools, entries, cat, bundled, by_name, size, n, seed) -> dict:
    """Multi-step tasks end to end (`Agent.run_turn`: steps split, each routed, arguments decoded with the
    earlier results in view, the real bundled servers called); a task is exact when every step called its
    gold tool with acceptable arguments."""
    import json
    import tempfile

    import numpy as np

    from evals.agent_tasks import args_equal, make_multi_tasks
    from nexus_agent.servers import ServerPool
    from registry.servers import command_for

    tasks = make_multi_tasks(n, seed)
    rng = np.random.default_rng(seed + size + 1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        names = ("calculator", "clock", "notes")
        commands = {s: command_for(s) + (f" --db {tmp}/notes.sqlite" if s == "notes" else "") for s in names}
        pool = ServerPool(commands, {t.name: t.server for t in tools[:bundled] if t.server in names})
        saved_pool, saved_router = agent.pool, agent.router
        agent.pool = pool
        try:
            for task in tasks:
                golds = [by_name[t] for t, _ in task.steps]
                others = [i for i in _registry(rng, golds[0], bundled, len(tools), size + len(golds))
                          if i not in golds]
                idx = golds + others[: max(size - len(golds), 0)]
                agent.router = _router(emb, cat, entries, idx)
                _cold(agent.live)
                turn = agent.run_turn(task.request)
                results, ok = [], len(turn.calls) == len(task.steps)
                for k, call in enumerate(turn.calls[: len(task.steps)]):
                    gold_tool = task.steps[k][0]
                    accepted = task.gold(k, results) if len(results) == k else []
                    ok = ok and call.tool == gold_tool and any(args_equal(call.arguments, g) for g in accepted)
                    try:
                        results.append(json.loads(call.observation.text))
                    except ValueError:
                        results.append({})
                rows.append({"request": task.request, "exact": ok,
                             "calls": [{"tool": c.tool, "arguments": c.arguments, "status": c.observation.status,
                                        "value_sources": c.value_sources} for c in turn.calls]})
                agent.trace.events.clear()
        finally:
            agent.pool, agent.router = saved_pool, saved_router
            pool.close()
    return {"multi_exact": sum(r["exact"] for r in rows) / len(rows), "multi_tasks": len(rows), "multi_rows": rows}


def _router(emb, cat, entries, idx):
    """The SLB router as `nexus run` uses it, over the registry `idx`: the scan's top-1 when its margin clears
    the gate, else the fused order (cosine + BM25; default GateConfig, no cross-encoder), with no "none"
    floor (every task here needs a tool). Each tool has its text row plus, with `--examples template`, its
    templated example rows, as `nexus register` stores them."""
    from slb.gate import GateConfig
    from slb.index import ScanIndex
    from slb.router import Router

    m8, sc, _, row_tool = cat.registry(idx)
    return Router(emb, ScanIndex(m8, sc, row_tool=row_tool), [entries[i] for i in idx], GateConfig(floor=-1.0),
                  mode="gate")


class _NoCall:
    def __init__(self, tool):
        self.tool, self.status, self.text, self.restarted, self.elapsed_ms = tool, "ok", "(not called)", False, 0.0

    ok = True

    def as_dict(self):
        return {"tool": self.tool, "status": self.status, "text": self.text, "elapsed_ms": 0.0, "restarted": False}


def _summary(rows: list[dict]) -> dict:
    base = [r for r in rows if "baseline_tokens" in r]
    fits = [r for r in base if r["baseline_ms"] is not None]
    med = statistics.median
    out = {
        "routing_acc": sum(r["routed"] == r["gold"] for r in rows) / len(rows),
        "json_valid": sum(r["valid"] for r in rows) / len(rows),
        "args_exact": sum(r["exact"] for r in rows) / len(rows),
        "ttfat_ms": med(r["ttfat_ms"] for r in rows),
        "context_tokens": med(r["context_tokens"] for r in rows),
        "ttfat_baseline_ms": med(r["baseline_ms"] for r in fits) if fits and len(fits) == len(base) else None,
        "context_tokens_baseline": med(r["baseline_tokens"] for r in fits) if fits and len(fits) == len(base) else None,
        "baseline_prompt_tokens": med(r["baseline_tokens"] for r in base) if base else None,
        "baseline_overflows": bool(base) and len(fits) < len(base),
        "full_schema_share": sum(r["source"] == "full_schema" for r in rows) / len(rows),
        "tasks": len(rows), "baseline_tasks": len(base),
    }
    if out["ttfat_baseline_ms"]:
        ours = med(r["ttfat_ms"] for r in base)
        out["ttfat_ratio_baseline_over_ours"] = out["ttfat_baseline_ms"] / ours
    return out


def _print_table(result: dict) -> None:
    print(f"agent eval · {result['backend']} · {result['tasks']} tasks · router: {result['router']}")
    print(f"{'tools':>6} {'route':>6} {'valid':>6} {'exact':>6} {'ttfat ms':>9} {'base ms':>9} {'ratio':>6} "
          f"{'ctx':>5} {'base ctx':>9}")
    for n, s in result["sizes"].items():
        def f(v, spec):
            return format(v, spec) if v is not None else "null"
        print(f"{n:>6} {s['routing_acc']:>6.1%} {s['json_valid']:>6.1%} {s['args_exact']:>6.1%} "
              f"{s['ttfat_ms']:>9.0f} {f(s['ttfat_baseline_ms'], '9.0f'):>9} "
              f"{f(s.get('ttfat_ratio_baseline_over_ours'), '6.1f'):>6} {s['context_tokens']:>5.0f} "
              f"{f(s['context_tokens_baseline'], '9.0f'):>9}"
              + (f"  (baseline prompt {s['baseline_prompt_tokens']:.0f} tokens > {N_CTX}: overflows)"
                 if s["baseline_overflows"] else ""))
        if "multi_exact" in s:
            print(f"{'':>6} multi-step exact {s['multi_exact']:.1%} over {s['multi_tasks']} tasks")


def table(r: dict) -> str:
    """Markdown: per registry size, routing / JSON-valid / exact-argument rates, TTFAT and context tokens against
    the concatenate-all baseline."""
    return md_table(["tools", "routing", "JSON valid", "args exact", "multi-step exact", "TTFAT (ms)",
                     "baseline TTFAT (ms)", "context (tok)", "baseline context (tok)"],
                    [[n, pct(s["routing_acc"]), pct(s["json_valid"]), pct(s["args_exact"]), pct(s.get("multi_exact")),
                      _ms(s["ttfat_ms"]), _ms(s["ttfat_baseline_ms"]), _ms(s["context_tokens"]),
                      _ms(s["baseline_prompt_tokens"])]
                     for n, s in sorted(r["sizes"].items(), key=lambda kv: int(kv[0]))])


def _ms(v):
    """A median for the table: a whole number (None stays None)."""
    return None if v is None else int(round(v))


def baseline_figure(r: dict):
    """Nexus vs the concatenate-all baseline per registry size: context tokens and time to first argument token."""
    sizes = sorted(r.get("sizes") or {}, key=int)
    if not sizes:
        return None
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(11, 4.5))
    x = range(len(sizes))
    w = 0.38
    for ax, ours, base, ylabel, title in (
            (a, "context_tokens", "baseline_prompt_tokens", "prompt tokens (median)", "Context per argument call"),
            (b, "ttfat_ms", "ttfat_baseline_ms", "time to first argument token (ms, median)", "TTFAT")):
        ax.bar([i - w / 2 for i in x], [r["sizes"][s][ours] or 0 for s in sizes], w, label="Nexus (signature)")
        ax.bar([i + w / 2 for i in x], [r["sizes"][s].get(base) or 0 for s in sizes], w,
               label="concatenate-all baseline (0: did not fit / not run)")
        ax.set_xticks(list(x), [f"{s} tools" for s in sizes])
        ax.set(xlabel="registry size", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    return fig


FIGURES = (Figure("agent.png", baseline_figure),)
