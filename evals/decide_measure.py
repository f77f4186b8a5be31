"""`nexus eval decide`'s measurements: the scored items, each item's registry, and the one model pass per item and
variant that reads everything a decide profile needs (`measure`), and the time to a complete call through the
engine (`time_calls`)."""

from __future__ import annotations

import json
import time
from dataclasses import replace


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


def jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def items(args, names: list[str]) -> list[dict]:
    """The scored items: {kind, messages, gold (relevant only), key}, a seeded sample of each kind."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    pos = set(names)
    rel = [q for q in jsonl(args.queries) if q.get("gold_tool") in pos]
    irr = jsonl(args.irrelevant) if args.irrelevant else []
    chat = jsonl(args.chat) if args.chat else []

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


def registry(seed: int, j: int, size: int, catalogue: list, gold: str | None) -> list:
    """Item `j`'s tools at `size` in the run seeded `seed`: its gold tool (if any) at a seeded position among size-1
    seeded distractors (the same for every variant and model, and for the timed calls)."""
    import numpy as np

    rng = np.random.default_rng(seed * 100003 + j * 7 + size)
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
    log-probability, the router's evidence, the final hidden state at the prompt's end (`h`, None where the backend
    cannot read it), timings.

    Every pass starts from a context holding the prompt's head (system text and tools preamble, which any
    earlier request leaves cached), so text and spliced variants pay for the same tokens. `blocks`: a
    `ToolBlocks` to splice the candidates from (their blocks compiled first, after the head, in a scratch
    session: `nexus compile`'s canonical place, never this prompt's own context)."""
    from nexus_agent.turn.profile import DecideProfile

    dec = engine.decider
    kept = dec.profile, dec.blocks, dec.all_names, dec.read_hidden  # restored: the router rows and timed calls use them
    dec.profile = DecideProfile(mode="model", k=k, k_sure=k_sure, fit_all=fit_all, bias=1e6)  # always the names
    dec.blocks = blocks
    dec.all_names = True  # every candidate's log-probability: variants are scored from them offline
    dec.read_hidden = True  # the final hidden state, where the backend reads it: the hidden-state rule is fitted on it
    try:
        return _measured(engine, req, blocks)
    finally:
        dec.profile, dec.blocks, dec.all_names, dec.read_hidden = kept


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
            "decide_ms": d.decide_ms, "prefill_ms": d.prefill_ms, "spliced": d.spliced, "ms": ms,
            "h": None if d.hidden is None else [round(float(x), 4) for x in d.hidden]}


def time_calls(engine, profile, scored, sizes, catalogue, args, out, name) -> None:
    """call_ms_p50 of the shipped decision (`nexus`) and of the router through the engine's whole request path."""
    from nexus_agent.openai_api import ChatRequest

    rel = [(j, it) for j, it in enumerate(scored) if it["kind"] == "relevant"][: args.timed]
    for size in sizes:
        for vname, prof in (("nexus", profile), ("router", replace(profile, mode="router"))):
            engine.decider.profile = prof
            times = []
            for j, it in rel:
                tools = registry(args.seed, j, size, catalogue, it["gold"])
                req = ChatRequest(model=name, messages=it["messages"], tools=tools)
                t0 = time.perf_counter()
                engine.run(req, lambda ev: None, lambda: False)
                times.append((time.perf_counter() - t0) * 1e3)
            if times:
                import numpy as np

                out["sizes"][str(size)][name][vname]["call_ms_p50"] = float(np.median(times))
    engine.decider.profile = profile
