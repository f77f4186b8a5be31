"""`nexus eval decide`'s table and figure."""

from __future__ import annotations

from evals.render import Figure, log_ticks, md_table, pct, pyplot

COLUMNS = (("decision", "decision_acc"), ("tool", "tool_acc"), ("irrel->none", "irrelevant_no_call"),
           ("chat->none", "chat_no_call"), ("rel->none", "relevant_no_call"), ("recall@k", "recall_at_k"))


def table(r: dict) -> str:
    rows = []
    for size, models in r["sizes"].items():
        for model, variants in models.items():
            for v, m in variants.items():
                rows.append([size, model, v, *[pct(m.get(key)) if m.get(key) is not None else "–"
                                                for _, key in COLUMNS],
                             _ms(m.get("prefill_ms_p50")), _ms(m.get("decide_ms_p50")), _ms(m.get("call_ms_p50")),
                             "–" if m.get("prompt_tokens_p50") is None else f"{m['prompt_tokens_p50']:.0f}",
                             _same(m), str(m.get("failed", 0))])
    head = ["tools", "model", "variant", *[c for c, _ in COLUMNS], "prefill ms", "decide ms", "call ms",
            "prompt tok", "same as text", "failed"]
    return md_table(head, rows)


def _same(m: dict) -> str:
    """A spliced variant's decisions the same as text's: the model's own, and (after a slash) the shipped
    setting's, with the setting's recheck."""
    parts = [pct(m[k]) for k in ("same_as_text", "same_as_text_nexus") if m.get(k) is not None]
    return " / ".join(parts) or "–"


def _ms(v) -> str:
    return "–" if v is None else f"{v:.0f}"


def accuracy_figure(r: dict):
    """Decision accuracy vs registry size, one panel per model, one colour per variant in every panel (the shipped
    `nexus` drawn thickest); a variant that failed every item (its prompt overflowed) is an x at 0. With one size,
    every metric as bars."""
    plt = pyplot()
    sizes = sorted(int(s) for s in r["sizes"])
    if len(sizes) == 1:
        fig, ax = plt.subplots(figsize=(7, 4))
        return _bars(fig, ax, r, sizes[0])
    series: dict[str, dict[str, list]] = {}
    for s in sizes:
        for model, variants in r["sizes"][str(s)].items():
            for v, m in variants.items():
                series.setdefault(model, {}).setdefault(v, []).append((s, m))
    names = sorted({v for per in series.values() for v in per}, key=lambda v: (v != "nexus", v != "router", v))
    colour = {v: f"C{i % 10}" for i, v in enumerate(names)}
    legend_in = 1.7  # inches at the right kept for the legend ("overflowed every item" is its widest label)
    width = 3.4 * len(series) + legend_in
    fig, axes = plt.subplots(1, len(series), figsize=(width, 3.8), sharey=True, squeeze=False)
    for ax, (model, per) in zip(axes[0], sorted(series.items())):
        for v, pts in sorted(per.items(), key=lambda kv: names.index(kv[0])):
            ok = [(s, m["decision_acc"]) for s, m in pts if m.get("decision_acc") is not None and not _overflowed(m)]
            if ok:
                ax.plot([p[0] for p in ok], [p[1] for p in ok], color=colour[v], **_style(v))
            bad = [s for s, m in pts if _overflowed(m)]
            if bad:
                ax.plot(bad, [0.0] * len(bad), marker="x", ls="none", ms=8, color=colour[v], clip_on=False)
        log_ticks(ax, sizes)
        ax.set_xlabel("tools in the registry")
        ax.set_title(model, fontsize=9)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("decision accuracy")
    handles = [plt.Line2D([], [], color=colour[v], label=v, **_style(v)) for v in names]
    handles.append(plt.Line2D([], [], color="k", marker="x", ls="none", label="overflowed every item"))
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    fig.suptitle("Right tool when one is wanted, no call otherwise", fontsize=10)
    fig.set_layout_engine("tight", rect=(0, 0, 1 - legend_in / width, 1))
    return fig


def _style(v: str) -> dict:
    """The shipped setting thick on top; the router alone and every tool in the prompt hollow and larger, so a
    variant that scores the same (a router-mode model's `nexus`) is seen beneath the other."""
    if v == "nexus":
        return {"marker": "o", "lw": 2.5, "zorder": 3}
    if v in ("router", "all"):
        return {"marker": "s" if v == "router" else "D", "ms": 9, "mfc": "none", "ls": "--", "lw": 1.2, "zorder": 2}
    return {"marker": "o", "lw": 1.2, "zorder": 2}


def _overflowed(m: dict) -> bool:
    return bool(m.get("n")) and m.get("failed", 0) >= m["n"]


def _bars(fig, ax, r: dict, size: int):
    import numpy as np

    series = [(f"{model} {v}", m) for model, variants in r["sizes"][str(size)].items()
              for v, m in sorted(variants.items())]
    x = np.arange(len(COLUMNS))
    width = 0.8 / max(len(series), 1)
    for i, (label, m) in enumerate(series):
        ax.bar(x + i * width - 0.4 + width / 2, [m.get(key) or 0.0 for _, key in COLUMNS], width, label=label)
    ax.set_xticks(x, [c for c, _ in COLUMNS])
    ax.set_ylabel("share of items")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title(f"Deciding among {size} tools (rel->none: lower is better)")
    return fig


FIGURES = (Figure("decide.png", accuracy_figure),)
