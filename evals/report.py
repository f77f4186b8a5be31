"""Run every eval at a report size and write REPORT.md with tables and plots (`nexus eval all --out DIR`).

Each eval runs in this process through its own `add_arguments`/`run` with the arguments in PLANS (the full
plan is sized for ~30 minutes on 2 shared cores; `--tiny` is a smoke-size plan for tests), and its JSON goes to
DIR/NAME.json. The report is then written from every NAME.json present in DIR, so a long run can be split:
`--only scan,routing` runs just those, `--reuse` keeps JSON already in DIR instead of re-running it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

PUBLIC_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing"  # ../shared beside the repo
ORDER = ("backends", "scan", "routing", "splice", "eviction", "agent")

# name -> arguments for `nexus eval NAME`; the report states them.
PLANS: dict[str, list[str]] = {
    "backends": ["--lengths", "256,1024,4096", "--decode-tokens", "32", "--repeats", "2",
                 "--backends", "llamacpp,mlx,llamacpp-highlevel"],
    "scan": ["--sizes", "250,1000,10000,100000", "--repeats", "100"],
    "routing": ["--sizes", "10,50,100,250", "--train-steps", "150",
                "--irrelevant", str(PUBLIC_DATA / "queries_irrelevant.jsonl")],
    "splice": ["--backend", "llamacpp,mlx", "--depths", "0,64,256,512,1024,2048", "--n-tools", "16", "--calib-tools", "4",
               "--calibrate"],
    "eviction": ["--quick"],
    "agent": ["--quick", "--sizes", "10,250"],
}
TINY: dict[str, list[str]] = {
    "backends": ["--lengths", "64", "--decode-tokens", "8", "--repeats", "1", "--backends", "llamacpp"],
    "scan": ["--sizes", "250,2000", "--repeats", "20"],
    "routing": ["--sizes", "10,50", "--max-queries", "30", "--reranker", "none"],
    "splice": ["--backend", "llamacpp", "--depths", "0,64", "--n-tools", "1", "--calib-tools", "1"],
    "eviction": ["--quick"],
    "agent": ["--quick", "--sizes", "10", "--tasks", "4", "--baseline-tasks", "1"],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="evals/report", help="folder for NAME.json, the PNG plots and REPORT.md")
    p.add_argument("--only", default=None, help=f"comma-separated evals to run (default: all of {','.join(ORDER)})")
    p.add_argument("--reuse", action="store_true", help="keep NAME.json already in --out instead of re-running")
    p.add_argument("--tiny", action="store_true", help="smoke-size arguments (seconds per eval; for tests)")


def run_eval(name: str, argv: list[str], out: Path) -> dict:
    """Run `nexus eval NAME argv` in-process; write out/NAME.json (with the arguments and wall time) and return it."""
    from evals.cli import EVALS, write_json

    module = importlib.import_module(EVALS[name])
    parser = argparse.ArgumentParser(prog=f"nexus eval {name}")
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    args.json_out = str(out / f"{name}.json")
    t0 = time.perf_counter()
    result = module.run(args)
    result["report_meta"] = {"args": argv, "wall_s": round(time.perf_counter() - t0, 1),
                             "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json(result, args.json_out)
    return result


def selected(only: str | None) -> list[str]:
    names = [n.strip() for n in only.split(",") if n.strip()] if only else list(ORDER)
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        raise ValueError(f"unknown eval(s) in --only: {', '.join(unknown)}; choose from {', '.join(ORDER)}")
    return names


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("NEXUS_THREADS", "1")  # 2 shared cores: never oversubscribe (DESIGN §3)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plans = TINY if args.tiny else PLANS
    status = {}
    for name in selected(args.only):
        path = out / f"{name}.json"
        if args.reuse and path.exists():
            status[name] = "reused"
            continue
        print(f"== nexus eval {name} {' '.join(plans[name])}", flush=True)
        run_eval(name, plans[name], out)
        status[name] = "ran"
    report = write_report(out)
    print(f"wrote {report}")
    return {"out": str(out), "report": str(report), "status": status, "tiny": bool(args.tiny)}


# -- REPORT.md ----------------------------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _pct(v):
    return None if v is None else f"{v * 100:.1f} %"


def table_backends(r: dict) -> str:
    bs = r["backends"]
    lengths = sorted({n for b in bs.values() for n in b["prefill_tps"]}, key=int)
    return _table(["backend", *[f"prefill {n} (tok/s)" for n in lengths], "decode (tok/s)"],
                  [[k, *[b["prefill_tps"].get(n) for n in lengths], b["decode_tps"]] for k, b in bs.items()])


def table_scan(r: dict) -> str:
    return _table(["registry size", "Numba INT8 p50 (µs)", "NumPy float32 p50 (µs)", "speedup"],
                  [[n, s["numba_us_p50"], s["numpy_f32_us_p50"], f"{s['speedup']:.1f}×"]
                   for n, s in sorted(r["sizes"].items(), key=lambda kv: int(kv[0]))])


def table_routing(r: dict) -> str:
    def none_precision(s):  # null when the eval ran without --irrelevant
        v = s.get("none_precision")
        return "—" if v is None or v != v else _pct(v)

    return _table(["tools", "top-1 float32", "top-1 INT8", "top-1 routed", "top-1 routed (no CE)", "auto-routed",
                   "auto precision", "irrelevant → none", "route p50 (ms)"],
                  [[n, _pct(s["top1_embed"]), _pct(s["top1_int8"]), _pct(s["top1_routed"]),
                    _pct(s.get("top1_routed_lex")), _pct(s["auto_rate"]),
                    _pct(s["auto_precision"]), none_precision(s), s["route_ms_p50"]]
                   for n, s in sorted(r["sizes"].items(), key=lambda kv: int(kv[0]))])


def table_splice(r: dict) -> str:
    rows, bars = [], []
    for name, res in r["backends"].items():
        for d in sorted(res["depths"], key=int):
            row = res["depths"][d]
            for v, s in row.items():
                if s.get("kl") is None:
                    continue
                if v == "text" and "batched_kl" in s:  # the noise floor, then the one-batch prefill that is timed
                    rows.append([name, d, "text (one-token batches)", s["kl"], _pct(s["top1"]),
                                 _pct(s.get("top1_decisive")), None, None])
                    rows.append([name, d, "text (one batch)", s["batched_kl"], _pct(s["batched_top1"]), None,
                                 s["ttft_ms"], None])
                    continue
                rows.append([name, d, v, s["kl"], _pct(s["top1"]), _pct(s.get("top1_decisive")), s["ttft_ms"],
                             s.get("speedup")])
            rep, text = row["repaired"], row["text"]
            kl_bar, top1_bar = max(0.01, 3 * text["kl"]), text["top1"] - 0.02
            speed_bar = 1.7 if int(d) <= 256 else 1.3 if int(d) >= 2048 else None
            fast = speed_bar is None or rep["speedup"] >= speed_bar
            ok = rep["kl"] <= kl_bar and rep["top1"] >= top1_bar - 1e-9 and fast
            bars.append([name, d, rep["kl"], kl_bar, _pct(rep["top1"]), _pct(top1_bar), rep["speedup"], speed_bar,
                         "yes" if ok else "**no**"])
    return "\n\n".join([
        _table(["backend", "depth", "variant", "KL (nats)", "top-1", "top-1 (decisive)", "TTFT (ms)",
                "speedup vs text"], rows),
        "The issue's targets for the repaired splice: KL ≤ max(0.01, 3 × text KL), top-1 ≥ text top-1 − 0.02 (text: "
        "the segment prefilled again in one-token batches), TTFT speedup over the one-batch text prefill ≥ 1.7× at "
        "depth ≤ 256 and ≥ 1.3× at 2048:",
        _table(["backend", "depth", "repaired KL", "KL bar", "repaired top-1", "top-1 bar", "speedup", "speedup bar",
                "met"], bars)])


def table_eviction(r: dict) -> str:
    budgets = sorted(r["budgets"], key=float)
    policies = list(r["budgets"][budgets[0]])
    rows = [[p, *[r["budgets"][b][p]["median_rel_err"] for b in budgets],
             _pct(r["budgets"]["0.25"][p].get("recall_rel")) if "0.25" in r["budgets"] else None] for p in policies]
    cert = r.get("certificate") or {}
    rows.append(["certified: certificate coverage", *[_pct((cert.get(b) or {}).get("coverage")) for b in budgets],
                 None])
    rows.append(["certified: certificate Spearman", *[(cert.get(b) or {}).get("spearman") for b in budgets], None])
    parts = [_table(["policy", *[f"median error @ {float(b) * 100:g} %" for b in budgets], "fact recall @ 25 %"],
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
            rows.append([name, _pct(st.get("recall_rel")), _pct(aw.get("recall_rel")),
                         _pct(st.get("flag_rate", st.get("red_flag_rate"))), _pct(st.get("recall_after_flag_acc")),
                         _pct(aw.get("recall_after_flag_acc"))])
        parts.append(_table(["policy", "recall (stream)", "recall (aware)", "flag rate (stream)",
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
        parts.append(_table(["variant", *[str(i + 1) for i in range(n_ev)]], rows))
    ovh = [r[k] for k in ("overhead", "overhead_4k") if k in r]
    if ovh:
        parts.append("Decode time per token (ms): full cache, a plain cache of the evicting session's size, and the "
                     "evicting session (hook, masks and decode-time eviction events at their real frequency); "
                     "overhead = (evicting − same size) / full.")
        parts.append(_table(["context (tokens)", "budget (tokens)", "decode full", "decode same size",
                             "decode evicting", "eviction (ms/event)", "overhead (% of decode)", "KV bytes full",
                             "KV bytes evicting"],
                            [[o["context_tokens"], o.get("budget_tokens"), o["decode_ms_full_cache"],
                              o.get("decode_ms_same_size_plain"), o["decode_ms_evicting"], o["evict_ms_per_event"],
                              _pct(o["decode_overhead_frac"]), o.get("kv_bytes_full"), o.get("kv_bytes_evicting")]
                             for o in ovh]))
    return "\n\n".join(parts)


def table_agent(r: dict) -> str:
    return _table(["tools", "routing", "JSON valid", "args exact", "TTFAT (ms)", "baseline TTFAT (ms)",
                   "context (tok)", "baseline context (tok)"],
                  [[n, _pct(s["routing_acc"]), _pct(s["json_valid"]), _pct(s["args_exact"]), s["ttfat_ms"],
                    s["ttfat_baseline_ms"], s["context_tokens"], s["baseline_prompt_tokens"]]
                   for n, s in sorted(r["sizes"].items(), key=lambda kv: int(kv[0]))])


SECTIONS = {
    "backends": ("Backend speed", "Prefill and decode throughput of our llama.cpp and MLX sessions against "
                 "llama-cpp-python's high-level `Llama`, same GGUF, same process.", table_backends),
    "scan": ("SLB scan", "Top-k scan over the INT8 embedding buffer (Numba) vs a float32 NumPy scan, one thread.",
             table_scan),
    "routing": ("Routing", "Top-1 accuracy of the semantic lookaside buffer as the registry grows (gold tool plus "
                "seeded distractors).", table_routing),
    "splice": ("Schema splicing", "KL and top-1 agreement of a spliced schema block against a full prefill, and "
               "time to first token, per insertion depth and splice variant.", table_splice),
    "eviction": ("KV eviction", "Relative attention-output error per policy and budget (offline replay on captured "
                 "Q/K/V), the certified policy's certificate coverage, and fact recall.", table_eviction),
    "agent": ("Agent", "Argument generation through the signature path vs the concatenate-all-schemas baseline.",
              table_agent),
}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_report(out: Path) -> Path:
    """REPORT.md from every NAME.json in `out` (plots regenerated from the JSON); returns its path."""
    from evals.report_plots import FIGURES

    parts = ["# Nexus evaluation report", "",
             f"Regenerated by `nexus eval all --out {out}/` (commit {_git_commit()}, {platform.machine()}, "
             f"{os.cpu_count()} CPUs, NEXUS_THREADS={os.environ.get('NEXUS_THREADS', 'default')}). Each section "
             "states the arguments its eval ran with; rerun one with `nexus eval all --only NAME` (the others' JSON is kept and reported).", ""]
    missing = []
    for name in ORDER:
        path = out / f"{name}.json"
        if not path.exists():
            missing.append(name)
            continue
        r = json.loads(path.read_text())
        title, blurb, table = SECTIONS[name]
        meta = r.get("report_meta") or {}
        if meta:
            ran = (f"`nexus eval {name} {' '.join(meta.get('args', []))}` — {meta.get('wall_s', '?')} s, "
                   f"finished {meta.get('finished', '?')}.")
        else:  # NAME.json written by `nexus eval NAME --json` directly: no timing was recorded
            ran = f"Run directly as `nexus eval {name} {' '.join(PLANS[name])}` (wall time not recorded)."
        parts += [f"## {title}", "", blurb, "", ran, ""]
        try:
            parts += [table(r), ""]
        except (KeyError, TypeError, ValueError) as e:
            parts += [f"(table unavailable: {name}.json lacks {e})", ""]
        for fig in FIGURES[name]:
            png = fig(r, out)
            if png:
                parts += [f"![{title}]({png})", ""]
    if missing:
        parts += ["## Not run yet", "", ", ".join(missing) + f": run `nexus eval all --out {out}/ --only "
                  f"{','.join(missing)}`.", ""]
    report = out / "REPORT.md"
    report.write_text("\n".join(parts))
    return report
