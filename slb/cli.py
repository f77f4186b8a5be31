"""`nexus route "..."` and `nexus slb build | calibrate | train-reranker`: thin layer over slb.service."""

from __future__ import annotations

import argparse
import json
import time


def register(sub: argparse._SubParsersAction) -> None:
    from registry.cli import AFTER_REGISTER

    tools = getattr(sub.choices.get("tools"), "commands", None)
    if tools is not None:
        d = tools.add_parser("duplicates", help="near-duplicate tools (same job, different names; slb.duplicates)")
        d.add_argument("--json", action="store_true")
        d.set_defaults(func=_duplicates)
    AFTER_REGISTER.append(_check_duplicates)
    r = sub.add_parser("route", help="route a request to a tool (auto | rerank | none)")
    r.add_argument("query")
    r.add_argument("--mode", choices=("gate", "embed", "rerank"), default="gate")
    r.add_argument("--reranker", default=None, help="a CrossEncoder folder (default: the registry's trained one)")
    r.add_argument("--json", action="store_true", help="print the decision as JSON")
    r.add_argument("--label", metavar="TOOL", default=None,
                   help="confirm or correct the route: store the request as a learned example of TOOL and rebuild "
                        "the buffer (incremental)")
    r.set_defaults(func=_route)

    p = sub.add_parser("slb", help="the semantic lookaside buffer (routing index)")
    s = p.add_subparsers(dest="slb_command", metavar="ACTION", required=True)
    b = s.add_parser("build", help="embed the registry's tools into the INT8 buffer (incremental)")
    _embedder_args(b)
    b.set_defaults(func=_build)
    c = s.add_parser("calibrate",
                     help="fit the margin gate tau, the score floor and the cosine/BM25/cross-encoder weights")
    _embedder_args(c)
    c.add_argument("--queries", default=None, help='labelled JSONL {"query", "gold_tool"} (default: synthesized)')
    c.add_argument("--target", type=float, default=0.97, help="auto-routed precision to reach")
    c.add_argument("--floor-recall", type=float, default=0.98, help="share of relevant queries kept above the floor")
    c.set_defaults(func=_calibrate)
    t = s.add_parser("train-reranker", help="fine-tune a cross-encoder on the registry (CPU, minutes)")
    _embedder_args(t)
    t.add_argument("--queries", default=None, help="labelled JSONL to add to the synthesized queries")
    t.add_argument("--steps", type=int, default=400)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--out", default=None, help="folder to save it (default: under the Nexus home)")
    t.set_defaults(func=_train)


def _embedder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--embedder", default="packaged:all-MiniLM-L6-v2", help="packaged model or a model folder")
    p.add_argument("--recipe", default="schema", help="tool text: schema (default) | name_desc_params | name_desc")
    p.add_argument("--quantize", action="store_true",
                   help="dynamic INT8 embedder (faster queries; `nexus route` then uses it for this buffer)")


def _config(args):
    from slb.embedder import EmbedderConfig

    return EmbedderConfig(model=args.embedder, recipe=args.recipe, quantize=args.quantize)


def _route(args: argparse.Namespace) -> int:
    from slb.service import open_router

    t0 = time.perf_counter()
    router = open_router(args.mode, args.reranker)
    load_ms = (time.perf_counter() - t0) * 1e3
    d = router.route(args.query)
    label = _label(args) if args.label else None
    if label is None and args.label:
        return 1
    if args.json:
        print(json.dumps(d.as_dict() | {"load_ms": load_ms} | ({"label": label} if label else {}), indent=2))
        return 0
    if label:
        print(f"label {args.label}: {label}")
    t = d.timings
    print(f"{d.path}: {d.tool or '(no tool)'}  score={d.score:.3f} margin={d.margin:.3f}")
    if d.duplicates:
        print(f"  note: {d.tool} has near-duplicates among the candidates: "
              + ", ".join(f"{n} (cosine {c:.2f})" for n, c in d.duplicates)
              + "; the choice between them is arbitrary (see `nexus tools duplicates`)")
    print(f"  route {t['total_ms']:.1f} ms (embed {t['embed_ms']:.1f}, scan {1e3 * t['scan_ms']:.0f} µs, "
          f"rerank {t['rerank_ms']:.1f}); models and buffer loaded in {load_ms:.0f} ms")
    for name, cos, logit, lex in d.candidates[:5]:
        print(f"  {name:<40} cos={cos:.3f}" + (f" bm25={lex:.2f}" if lex is not None else "")
              + (f" rerank={logit:.2f}" if logit is not None else ""))
    return 0


def _label(args: argparse.Namespace) -> str | None:
    """Store the query as a learned example of --label TOOL and rebuild the buffer; a status line, or None
    (error printed) for an unknown tool."""
    import sys

    from registry.store import RegistryStore
    from slb.learn import ExampleLearner, LearnConfig
    from slb.service import build

    with RegistryStore() as store:
        try:
            new = ExampleLearner(store, LearnConfig()).confirm(args.query, args.label, force=True)
        except (KeyError, ValueError) as e:
            print(f"nexus route --label: {e.args[0]}", file=sys.stderr)
            return None
        r = build(store)
    return (f"learned ({r.examples_embedded} row embedded, buffer {r.rows} rows)" if new
            else "already an example of this tool")


def _build(args: argparse.Namespace) -> int:
    from slb.service import build

    r = build(config=_config(args))
    print(f"{r.path}: {r.count} tools ({r.embedded} embedded, {r.reused} reused, {r.removed} removed, "
          f"{r.from_store} from the embedding store), "
          f"{r.rows} rows, {len(r.duplicates)} near-duplicate pairs (`nexus tools duplicates`)")
    return 0


# registrations that change more tools than this skip the duplicate check (it embeds them: seconds per 100)
CHECK_MAX_TOOLS = 500


def _check_duplicates(store, report) -> list[str]:
    """After `nexus register`: rebuild the buffer (incremental) and warn about near-duplicate pairs that
    involve a tool this registration added or changed."""
    from slb.service import build

    changed = set(report.added) | set(report.updated)
    if len(changed) > CHECK_MAX_TOOLS:
        return [f"{len(changed)} tools changed: near-duplicates not checked now; run `nexus tools duplicates`"]
    pairs = build(store).duplicates
    return [f"{a} and {b} look like near-duplicates (cosine {c:.2f}): routing between them rests on the words "
            "that differ; if they do the same job, remove one" for a, b, c in pairs if a in changed or b in changed]


def _duplicates(args: argparse.Namespace) -> int:
    from slb.service import build

    pairs = build().duplicates  # incremental: embeds only tools the buffer does not have yet
    if args.json:
        print(json.dumps([{"a": a, "b": b, "cosine": c} for a, b, c in pairs], indent=1))
        return 0
    print(f"{len(pairs)} near-duplicate pairs (tool-text cosine >= threshold, slb.duplicates):")
    for a, b, c in pairs:
        print(f"  {c:.3f}  {a}  ~  {b}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from slb.embedder import Embedder
    from slb.service import buffer_path, calibrate, read_labelled, registry_tools

    labelled = read_labelled(args.queries) if args.queries else []
    cal = calibrate(registry_tools(), labelled, Embedder(_config(args)), buffer_path(), args.target, args.floor_recall)
    src = args.queries or "synthesized queries"
    print(f"tau={cal['tau']:.4f} floor={cal['floor']:.4f} "
          f"lex_weight={cal['lex_weight']:g} ce_weight={cal['ce_weight']:g} "
          f"on {cal['queries']} queries from {src}: "
          f"auto-route rate {cal['auto_rate']:.1%}, precision {cal['auto_precision']:.3f} (target {cal['target']})")
    return 0


def _train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from slb.embedder import Embedder
    from slb.reranker import RerankerTrainConfig
    from slb.service import read_labelled, registry_tools, train

    labelled = read_labelled(args.queries) if args.queries else []
    cfg = RerankerTrainConfig(max_steps=args.steps, threads=args.threads)
    meta = train(registry_tools(), Embedder(_config(args)), labelled, cfg, Path(args.out) if args.out else None)
    verb = ("reused" if meta["reused"]
            else f"trained in {meta['train_s']:.0f} s ({meta['steps']} steps, {meta['pairs']} pairs)")
    print(f"reranker {verb}: {meta['path']}")
    return 0
