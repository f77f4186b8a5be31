"""The report's plots, drawn from each eval's JSON (one function per figure; each returns the PNG file name, or
None when the JSON lacks what the figure needs). Every axis is labelled with its unit and every line has a legend.
"""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=120)
    _plt().close(fig)
    return name


def _log_ticks(ax, xs: list, fmt: str = "{:g}") -> None:
    """Log x axis with ticks at the measured points only (readable labels instead of 2×10¹)."""
    ax.set_xscale("log")
    ax.set_xticks(xs, [fmt.format(x) for x in xs])
    ax.minorticks_off()


def routing(r: dict, out: Path) -> str | None:
    """Top-1 routing accuracy (%) vs registry size (tools), float32 / INT8 embeddings and the full router."""
    sizes = sorted(int(s) for s in r.get("sizes", {}))
    if not sizes:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style in (("top1_embed", "embedding float32", "-"), ("top1_int8", "embedding INT8", "--"),
                              ("top1_routed", "gated + reranked router", "-")):
        ax.plot(sizes, [r["sizes"][str(s)][key] * 100 for s in sizes], style, marker="o", label=label)
    _log_ticks(ax, sizes)
    ax.set(xlabel="registry size (tools, log scale)", ylabel="top-1 accuracy (%)",
           title="Routing accuracy vs registry size")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out, "routing_accuracy.png")


def scan(r: dict, out: Path) -> str | None:
    """p50 scan time (µs per query) vs registry size, Numba INT8 and NumPy float32."""
    sizes = sorted(int(s) for s in r.get("sizes", {}))
    if not sizes:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("numba_us_p50", "Numba INT8 scan"), ("numpy_f32_us_p50", "NumPy float32 scan")):
        ax.plot(sizes, [r["sizes"][str(s)][key] for s in sizes], marker="o", label=label)
    _log_ticks(ax, sizes)
    ax.set(yscale="log", xlabel="registry size (tools, log scale)",
           ylabel="scan time per query, p50 (µs, log scale)", title=f"Top-{r.get('k', 5)} scan time, 1 thread")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _save(fig, out, "scan_time.png")


SPLICE_VARIANTS = ("bare", "reanchored", "repaired", "suffix", "blend", "text", "roundtrip")


def splice_fidelity(r: dict, out: Path) -> str | None:
    """Mean KL (nats) and top-1 agreement vs insertion depth, one line per backend × splice variant."""
    backends = r.get("backends") or {}
    if not backends:
        return None
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, res in backends.items():
        ds = sorted(res["depths"], key=int)
        for v in SPLICE_VARIANTS:
            rows = [res["depths"][d].get(v) or {} for d in ds]
            if not rows or rows[0].get("kl") is None:
                continue
            xs = [int(d) for d in ds]
            a.plot(xs, [row["kl"] for row in rows], marker="o", label=f"{name} · {v}")
            b.plot(xs, [row["top1"] * 100 for row in rows], marker="o", label=f"{name} · {v}")
    a.set(xlabel="insertion depth (tokens before the block)", ylabel="mean KL vs full prefill (nats, symlog)",
          yscale="symlog", title="Splice fidelity: KL")
    a.axhline(0.01, ls="--", c="gray", label="0.01 nats target")
    b.set(xlabel="insertion depth (tokens before the block)", ylabel="top-1 agreement with full prefill (%)",
          title="Splice fidelity: top-1")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out, "splice_fidelity.png")


def splice_ttft(r: dict, out: Path) -> str | None:
    """Time to first token (ms) vs insertion depth per backend × variant (text = prefilling the schema)."""
    backends = r.get("backends") or {}
    if not backends:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in backends.items():
        ds = sorted(res["depths"], key=int)
        for v in ("repaired", "suffix", "text"):
            ys = [(res["depths"][d].get(v) or {}).get("ttft_ms") for d in ds]
            if None in ys:
                continue
            ax.plot([int(d) for d in ds], ys, marker="o", ls="--" if v == "text" else "-", label=f"{name} · {v}")
    ax.set(xlabel="insertion depth (tokens before the block)", ylabel="time to first token (ms)",
           title="TTFT: spliced block vs text prefill of the schema")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "splice_ttft.png")


def eviction(r: dict, out: Path) -> str | None:
    """Per policy vs KV budget: median attention error; certificate coverage; fact recall at 25 %."""
    budgets = sorted(r.get("budgets") or {}, key=float)
    if not budgets:
        return None
    plt = _plt()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.5))
    xs = [float(x) * 100 for x in budgets]
    cmap = plt.get_cmap("tab20")  # more policies than the default 10-colour cycle: keep every line distinct
    for i, name in enumerate(r["budgets"][budgets[0]]):
        a.plot(xs, [r["budgets"][x][name]["median_rel_err"] for x in budgets], marker="os^Dv"[i % 5],
               color=cmap(i % 20), linestyle=("-", "--")[i // 10 % 2], label=name)
    a.set(yscale="log", xlabel="KV budget (% of prompt tokens, log scale)",
          ylabel="median relative attention-output error (log)", title="Attention error vs budget (32-token blocks)")
    for key, label in (("certificate", "block level (32)"), ("certificate_token_level", "token level")):
        cert = r.get(key) or {}
        bs = sorted(cert, key=float)
        if bs:
            b.plot([float(x) * 100 for x in bs], [cert[x]["coverage"] * 100 for x in bs], marker="o", label=label)
    b.set(ylim=(0, 105), xlabel="KV budget (% of prompt tokens, log scale)",
          ylabel="certificate coverage (% of cells where error ≤ bound)", title="Certified policy: coverage")
    recall = r.get("recall") or {}
    rec, aware = recall.get("0.25") or {}, recall.get("0.25_aware") or {}
    names = [k for k in rec if rec[k].get("recall_rel") is not None]
    n_items = rec[names[0]].get("n_items") if names else None
    x = range(len(names))
    width = 0.4 if aware else 0.8
    c.bar([i - width / 2 * bool(aware) for i in x], [rec[k]["recall_rel"] * 100 for k in names], width,
          label="stream (evict before the question)")
    if aware:
        c.bar([i + width / 2 for i in x], [(aware.get(k) or {}).get("recall_rel", 0) * 100 for k in names], width,
              label="aware (question seen before eviction)")
    c.set_xticks(list(x), names, rotation=35, ha="right")
    c.set(xlabel="policy (+recall: certificate flag, _spill: disk-tier flag, _always: every item)",
          ylabel="fact recall relative to full cache (%)",
          title=f"Fact recall at 25 % budget ({n_items} items the full cache answers)")
    c.tick_params(axis="x", labelrotation=30, labelsize=7)
    for ax in (a, b):
        _log_ticks(ax, xs, "{:g} %")
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out, "eviction.png")


def agent(r: dict, out: Path) -> str | None:
    """Nexus vs the concatenate-all baseline per registry size: context tokens and time to first argument token."""
    sizes = sorted(r.get("sizes") or {}, key=int)
    if not sizes:
        return None
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
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
    return _save(fig, out, "agent.png")


FIGURES = {"routing": [routing], "scan": [scan], "splice": [splice_fidelity, splice_ttft], "eviction": [eviction],
           "agent": [agent], "backends": []}
