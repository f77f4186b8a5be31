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
    """Decision accuracy vs registry size per model and variant; with one size, every metric as bars."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = sorted(int(s) for s in r["sizes"])
    if len(sizes) == 1:
        return _bars(fig, ax, r, sizes[0])
    series: dict[tuple[str, str], list] = {}
    for s in sizes:
        for model, variants in r["sizes"][str(s)].items():
            for v, m in variants.items():
                series.setdefault((model, v), []).append((s, m.get("decision_acc")))
    for (model, v), pts in sorted(series.items()):
        pts = [(s, a) for s, a in pts if a is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{model} {v}")
    log_ticks(ax, sizes)
    ax.set_xlabel("tools in the registry")
    ax.set_ylabel("decision accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("Right tool when one is wanted, no call otherwise")
    return fig


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
