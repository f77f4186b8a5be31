"""`nexus eval serve`'s report: the targets' ratios within one run, the markdown table and the figure."""

from __future__ import annotations

from evals.render import Figure, md_table, pct, pyplot


def _ms(v: float | None) -> int | None:
    return None if v is None else round(v)


def targets(r: dict) -> dict:
    """The issue's ratios within this run: nexus's complete-call growth from the smallest to the largest size; at
    250 tools each peer's complete call over nexus's and the right-tool rates (a peer with no call: None); the
    conversation total over the best peer's."""
    out: dict = {}
    ours = r["servers"].get("nexus") or {}
    sizes = sorted(ours, key=int)
    if len(sizes) > 1 and ours[sizes[0]]["call_ms_p50"] and ours[sizes[-1]]["call_ms_p50"]:
        out["growth"] = {"from": int(sizes[0]), "to": int(sizes[-1]),
                         "ratio": round(ours[sizes[-1]]["call_ms_p50"] / ours[sizes[0]]["call_ms_p50"], 2)}
    at = "250" if "250" in ours else (sizes[-1] if sizes else None)
    for name, s in r["servers"].items():
        if name == "nexus" or at is None or at not in s:
            continue
        mine, theirs = ours[at], s[at]
        speedup = (round(theirs["call_ms_p50"] / mine["call_ms_p50"], 1)
                   if theirs["call_ms_p50"] and mine["call_ms_p50"] else None)
        out.setdefault("speedup", {})[name] = {"tools": int(at), "ratio": speedup, "nexus_tool_acc": mine["tool_acc"],
                                               "peer_tool_acc": theirs["tool_acc"], "peer_failed": theirs["failed"]}
    peers = [c["total_ms"] for n, c in r["conversation"].items() if n != "nexus" and c["total_ms"]]
    if peers and (r["conversation"].get("nexus") or {}).get("total_ms"):
        out["conversation_ratio"] = round(r["conversation"]["nexus"]["total_ms"] / min(peers), 2)
    return out


def _fails(x: dict) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in x["failures"].items())
    return f"{x['failed']}/{x['requests']}" + (f" ({kinds})" if kinds else "")


def table(r: dict) -> str:
    """Markdown: per server and tool-list size, the prompt with every tool (what a peer prefills; nexus shows a
    few), median ms to the first tool-call byte and to the complete call, the first request's call (a peer's cold
    prefill), right tool, valid arguments and failures by kind; then the conversation, the concurrent clients and
    the targets' ratios."""
    rows = []
    for name, sizes in r["servers"].items():
        for size in sorted(sizes, key=int):
            x = sizes[size]
            rows.append([name, size, _ms(x["prompt_tokens"]), _ms(x["first_byte_ms_p50"]), _ms(x["call_ms_p50"]),
                         _ms(x["first_call_ms"]),
                         pct(x["tool_acc"]), pct(x["args_valid"]), _fails(x)])
    out = md_table(["server", "tools", "prompt with every tool (tokens)", "first tool byte (ms, p50)",
                    "complete call (ms, p50)", "first request's call (ms)", "right tool", "args valid", "failed"], rows)
    idle = [f"{n} tools {x['idle_s']} s" + (f" ({x['blocks_pending']} left)" if x["blocks_pending"] else "")
            for n, x in sorted((r["servers"].get("nexus") or {}).items(), key=lambda kv: int(kv[0])) if "idle_s" in x]
    if idle:
        out += ("\n\nnexus was sent each list once (untimed) and compiled its blocks between requests before the "
                "timed requests (`--idle`): " + ", ".join(idle) + ".")
    if r["conversation"]:
        conv = [[n, _ms(c["total_ms"]), " / ".join(str(_ms(t)) for t in c["turn_ms"]), pct(c["tool_acc"]),
                 f"{c['failed']}/{len(c['turn_ms'])}"] for n, c in r["conversation"].items()]
        out += "\n\n" + md_table(["server", "conversation total (ms)", "per turn (ms)", "right tool", "failed"], conv)
    if r["concurrent"]:
        cc = [[n, c["clients"], c["requests"], c["wall_s"], _ms(c["first_byte_ms_p50"]), _ms(c["call_ms_p50"]),
               _ms(c["call_ms_p99"]),
               pct(c["tool_acc"]), _fails(c)] for n, c in r["concurrent"].items()]
        out += "\n\n" + md_table(["server", "streaming clients", "requests", "wall (s)", "first tool byte (ms, p50)",
                                  "complete call (ms, p50)", "p99", "right tool", "failed"], cc)
    t = r.get("targets") or {}
    lines = []
    if "growth" in t:
        g = t["growth"]
        lines.append(["nexus complete call, {} → {} tools".format(g["from"], g["to"]), f"{g['ratio']}×", "≤ 1.5×"])
    for name, s in (t.get("speedup") or {}).items():
        lines.append([f"{name} / nexus complete call at {s['tools']} tools",
                      f"{s['ratio']}×" if s["ratio"] else f"peer made no call ({s['peer_failed']} failed)",
                      f"≥ 10×, right tool {pct(s['nexus_tool_acc'])} vs {pct(s['peer_tool_acc'])}"])
    if "conversation_ratio" in t:
        lines.append(["nexus / best peer conversation total", f"{t['conversation_ratio']}×", "≤ 1×"])
    if lines:
        out += "\n\n" + md_table(["target", "measured", "wanted"], lines)
    logged = [[n, e, c] for n, errs in (r.get("server_errors") or {}).items() for e, c in errs.items()]
    if logged:
        out += "\n\n" + md_table(["server", "logged error", "log lines"], logged[:12])
    return out


def latency_figure(r: dict):
    """Left: median ms to the complete tool call (solid) and to its first byte (dashed) per tool-list size, per
    server; a size where a server made no call is a red mark naming it, never a zero. Right: the conversation's
    cumulative time per turn."""
    if not r.get("servers"):
        return None
    fig, (ax, bx) = pyplot().subplots(1, 2, figsize=(12, 5))
    failed: dict[int, list[str]] = {}
    colors = {name: f"C{k}" for k, name in enumerate(sorted(r["servers"]))}  # one colour per server, both plots
    for name, sizes in r["servers"].items():
        ns = sorted(sizes, key=int)
        for key, style, what in (("call_ms_p50", "-", "complete call"), ("first_byte_ms_p50", "--", "first byte")):
            pts = [(int(n), sizes[n][key]) for n in ns if sizes[n][key] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", linestyle=style, color=colors[name], label=f"{name}: {what}")
        for n in ns:
            if sizes[n]["call_ms_p50"] is None:
                kinds = ",".join(sizes[n]["failures"]) or "no call"
                failed.setdefault(int(n), []).append(f"{name} ({kinds})")
    for n, who in failed.items():
        ax.scatter([n], [100], marker="v", color="red", zorder=3)
        ax.annotate("\n".join(who), (n, 110), fontsize=6, color="red", ha="center", va="bottom")
    ax.set(xscale="log", yscale="log", xlabel="tools in the request", ylabel="ms (median)",
           title=f"Tool call over HTTP, same GGUF ({r.get('model', '')})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    for name, c in (r.get("conversation") or {}).items():
        total, pts = 0.0, []
        for k, ms in enumerate(c["turn_ms"]):
            if ms is None:
                break
            total += ms
            pts.append((k + 1, total / 1e3))
        if pts:
            bx.plot(*zip(*pts), marker="o", color=colors.get(name), label=name)
    bx.set(xlabel="turn", ylabel="s (cumulative)", title="Conversation over one tool list, tool results between turns")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7)
    fig.tight_layout()
    return fig


FIGURES = (Figure("serve.png", latency_figure),)
