"""The eviction eval's report section: its Markdown table and figure, drawn from `nexus eval eviction` JSON."""

from __future__ import annotations

from evals.render import Figure, log_ticks, md_table, pct, pyplot


def table(r: dict) -> str:
    """Markdown: median attention error per policy and budget with the certificate's coverage and Spearman, then
    (when present) fact recall per condition, needle survival per eviction event and decode overhead."""
    budgets = sorted(r["budgets"], key=float)
    policies = list(r["budgets"][budgets[0]])
    rows = [[p, *[r["budgets"][b][p]["median_rel_err"] for b in budgets],
             pct(r["budgets"]["0.25"][p].get("recall_rel")) if "0.25" in r["budgets"] else None] for p in policies]
    cert = r.get("certificate") or {}
    rows.append(["certified: certificate coverage", *[pct((cert.get(b) or {}).get("coverage")) for b in budgets],
                 None])
    rows.append(["certified: certificate Spearman", *[(cert.get(b) or {}).get("spearman") for b in budgets], None])
    parts = [md_table(["policy", *[f"median error @ {float(b) * 100:g} %" for b in budgets], "fact recall @ 25 %"],
                      rows)]
    rec = r.get("recall") or {}
    if "0.25_aware" in rec:  # fact recall per condition, with the certificate's and the disk tier's flags
        full = rec.get("full") or {}
        parts.append(f"Fact recall at 25 % on the {rec['0.25'][next(iter(rec['0.25']))]['n_items']} items the full "
                     f"cache answers ({full.get('answered')} of {full.get('n_facts')} facts, {full.get('traces')} "
                     "traces); +recall: re-answer after a certificate red flag, +recall_spill: after the disk tier's "
                     "flag, +recall_always: every item; the recall allowance is 10 % of the trace.")
        rows = []
        for name in rec["0.25"]:
            st, aw = rec["0.25"][name], rec["0.25_aware"].get(name) or {}
            rows.append([name, pct(st.get("recall_rel")), pct(aw.get("recall_rel")),
                         pct(st.get("flag_rate", st.get("red_flag_rate"))), pct(st.get("recall_after_flag_acc")),
                         pct(aw.get("recall_after_flag_acc"))])
        parts.append(md_table(["policy", "recall (stream)", "recall (aware)", "flag rate (stream)",
                               "after-flag accuracy (stream)", "after-flag accuracy (aware)"], rows))
    surv = r.get("survival") or {}
    if surv:
        n_ev = max(len(v["survival"]) for v in surv.values())
        parts.append("Needle survival after each eviction event: the share of the fixed needle set still cached "
                     "(mean over repeats), and (alive) the share of repeats with at least one needle cached:")
        rows = []
        for k, v in surv.items():
            for label, key in ((k, "survival"), (f"{k} (alive)", "alive")):
                if key in v:
                    rows.append([label, *[f"{x:.2f}" for x in v[key]], *[None] * (n_ev - len(v[key]))])
        parts.append(md_table(["variant", *[str(i + 1) for i in range(n_ev)]], rows))
    ovh = [r[k] for k in ("overhead", "overhead_4k") if k in r]
    if ovh:
        parts.append("Decode time per token (ms): full cache, a plain cache of the evicting session's size, and the "
                     "evicting session (hook, masks and decode-time eviction events at their real frequency); "
                     "overhead = (evicting − same size) / full.")
        parts.append(md_table(["context (tokens)", "budget (tokens)", "decode full", "decode same size",
                               "decode evicting", "eviction (ms/event)", "overhead (% of decode)", "KV bytes full",
                               "KV bytes evicting"],
                              [[o["context_tokens"], o.get("budget_tokens"), o["decode_ms_full_cache"],
                                o.get("decode_ms_same_size_plain"), o["decode_ms_evicting"], o["evict_ms_per_event"],
                                pct(o["decode_overhead_frac"]), o.get("kv_bytes_full"), o.get("kv_bytes_evicting")]
                               for o in ovh]))
    return "\n\n".join(parts)


def budget_figure(r: dict):
    """Per policy vs KV budget: median attention error; certificate coverage; fact recall at 25 %."""
    budgets = sorted(r.get("budgets") or {}, key=float)
    if not budgets:
        return None
    plt = pyplot()
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
        log_ticks(ax, xs, "{:g} %")
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


FIGURES = (Figure("eviction.png", budget_figure),)
