"""Glue between the SLB core and the registry store / Nexus home: what the CLI (and agent) call."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from registry.home import home_path
from slb.buffer import SLBuffer, write_buffer
from slb.build import BuildReport, build_buffer
from slb.duplicates import duplicate_map, margin_to_distinct
from slb.embed_store import EmbeddingStore
from slb.embedder import Embedder, EmbedderConfig, batch_threads
from slb.gate import GateConfig, gate_stats, pick_floor, pick_tau
from slb.reranker import Reranker, RerankerTrainConfig, registry_fingerprint, train_reranker, trained_for
from slb.router import Router
from slb.synth import synthesize_queries
from slb.tools import ToolEntry, as_entry

FRESH_KIND = "slb"


def buffer_path() -> Path:
    return home_path("slb", "buffer.slb")


# example sources that become buffer rows: templated examples are stored and shown but not routed on (with
# best-row scoring they lowered top-1 on the public data: 0.875 -> 0.857 at 250 tools, see notes/note28.md)
ROUTED_SOURCES = ("user", "learned")


def registry_tools(store=None, examples: tuple[str, ...] = ROUTED_SOURCES) -> list[ToolEntry]:
    """Tools of the registry store (default: the one in the Nexus home), each with its stored example requests
    of the given sources (registry.store.RegistryStore.examples) as extra buffer rows."""
    from registry.store import RegistryStore

    store = store or RegistryStore()
    ex = store.examples() if examples else {}
    tools = [dataclasses.replace(as_entry(t), examples=tuple(e.text for e in ex.get(t.name, ())
                                                             if e.source in examples))
             for t in store.list_tools()]
    if not tools:
        raise ValueError("the registry is empty: register tools first (`nexus register --server CMD` or files)")
    return tools


def build(store=None, config: EmbedderConfig | None = None, path: Path | None = None) -> BuildReport:
    """(Re)build the buffer from the registry and mark the tools fresh for the SLB. New tools' vectors come from the
    home's embedding store (slb.embed_store, shared with `nexus serve`) or are embedded on every core
    (`batch_threads`, unless `config.threads`)."""
    from registry.store import RegistryStore

    store = store or RegistryStore()
    tools = registry_tools(store)
    config = dataclasses.replace(config or EmbedderConfig(), threads=(config and config.threads) or batch_threads())
    report = build_buffer(tools, Embedder(config, EmbeddingStore()), path or buffer_path())
    for t in tools:
        store.mark_fresh(t.name, FRESH_KIND, t.schema_hash)
    return report


def buffer_is_current(store=None, path: Path | None = None) -> bool:
    """Whether the buffer holds exactly the rows the registry asks for now: every tool's text and its routed
    examples (user and learned ones added since the last build make it out of date); False without a buffer."""
    from slb.buffer import read_header
    from slb.tools import example_texts, row_key

    path = path or buffer_path()
    if not path.exists():
        return False
    try:
        h = read_header(path)
    except ValueError:
        return False
    want = [k for t in registry_tools(store) for k in (t.schema_hash, *map(row_key, example_texts(t)))]
    return (h.get("row_keys") or h["hashes"]) == want


def read_labelled(path: str | Path) -> list[tuple[str, str]]:
    """(query, gold_tool) pairs from a JSONL file of {"query", "gold_tool"}; rows without a gold tool skipped."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "query" not in row:
            raise ValueError(f"{path}:{n}: expected an object with 'query' and 'gold_tool'")
        if row.get("gold_tool"):
            out.append((row["query"], row["gold_tool"]))
    return out


def calibrate(tools: list[ToolEntry], labelled: list[tuple[str, str]], embedder: Embedder, path: Path,
              target: float = 0.97, floor_recall: float = 0.98, k: int = 10, seed: int = 0) -> dict:
    """Fit tau, the floor and the fusion weights (lex_weight, ce_weight; ce_weight 0 without a trained
    reranker) on labelled queries (default: synthesized from the tools) and store them in the buffer header.
    Returns the calibration with the auto-route rate and precision it yields on that set."""
    buf = SLBuffer(path, model_id=embedder.model_id)
    names = list(buf.names)
    pos = {n: i for i, n in enumerate(names)}
    if not labelled:
        import random

        rng = random.Random(seed)
        labelled = [(q, t.name) for t in tools for q in synthesize_queries(t, 2, rng)]
    labelled = [(q, g) for q, g in labelled if g in pos]
    if len(labelled) < 10:
        raise ValueError(f"only {len(labelled)} labelled queries name a tool in the buffer: need at least 10")
    qv = embedder.embed_texts([q for q, _ in labelled])
    s, ids = buf.index.scan_batch(qv, k=k)
    gold = np.array([pos[g] for _, g in labelled])
    dups = duplicate_map(buf.duplicates or [])
    margins = np.array([margin_to_distinct(si, ii, dups) for si, ii in zip(s, ids)])  # as the router measures it
    correct = ids[:, 0] == gold
    cal = {"tau": pick_tau(margins, correct, target), "floor": pick_floor(s[:, 0], floor_recall), "k": k,
           "target": target, "queries": len(labelled), "tools": len(names)}
    cal.update(gate_stats(margins, correct, cal["tau"]))
    rr_dir = default_reranker_dir(tools, embedder.config.recipe)
    rr = Reranker(rr_dir) if rr_dir.is_dir() else None
    cal["lex_weight"], cal["ce_weight"] = _fit_fusion_weights(rr, buf, tools, labelled, qv, gold, k,
                                                              embedder.config.recipe)
    data = buf.data()
    data.calibration = cal
    write_buffer(path, data)
    return cal


def _fit_fusion_weights(rr: Reranker | None, buf: SLBuffer, tools, labelled, qv, gold, k: int, recipe: str,
                        limit: int = 300) -> tuple[float, float]:
    """lex_weight and ce_weight (gate.pick_fusion_weights) on at most `limit` labelled queries; ce_weight 0
    without a trained cross-encoder."""
    from slb.gate import pick_fusion_weights
    from slb.lexical import LexicalIndex
    from slb.tools import lexical_text, tool_text

    by_name = {t.name: t for t in tools}
    lexical = LexicalIndex([lexical_text(by_name[n]) for n in buf.names])
    s, ids = buf.index.scan_batch(qv[:limit], k=k)
    lex = np.stack([lexical.scores(q, row) for (q, _), row in zip(labelled[:limit], ids)])
    logits = None
    if rr is not None:  # the cross-encoder reads tool texts in the recipe it was trained on
        texts = [tool_text(by_name[n], (rr.meta or {}).get("recipe", recipe)) for n in buf.names]
        logits = np.stack([rr.score(q, [texts[i] for i in row]) for (q, _), row in zip(labelled[:limit], ids)])
    pos = np.array([int(np.flatnonzero(row == g)[0]) if g in row else -1 for row, g in zip(ids, gold[:limit])])
    return pick_fusion_weights(s, lex, logits, pos)


def default_reranker_dir(tools: list[ToolEntry], recipe: str) -> Path:
    return home_path("rerankers", f"registry-{registry_fingerprint(tools, recipe)}")


def train(tools: list[ToolEntry], embedder: Embedder, labelled=(), cfg: RerankerTrainConfig | None = None,
          out: Path | None = None, progress: bool = True) -> dict:
    """Train (or reuse, when tools, labelled set and config match) the registry's reranker; returns its meta."""
    out = out or default_reranker_dir(tools, embedder.config.recipe)
    cfg = cfg or RerankerTrainConfig()
    meta = trained_for(out, tools, embedder.config.recipe, list(labelled), cfg)
    if meta:
        return {**meta, "reused": True, "path": str(out)}
    return {**train_reranker(tools, embedder, out, labelled, cfg, progress), "reused": False, "path": str(out)}


def open_router(mode: str = "gate", reranker: str | None = None, config: EmbedderConfig | None = None,
                tools: list[ToolEntry] | None = None, path: Path | None = None) -> Router:
    """A Router over the home buffer with its stored calibration and the matching (or given) reranker, its models
    loaded (the first route is timed as routing)."""
    path = path or buffer_path()
    if config is None and path.exists():  # a buffer built by the quantized embedder is routed with it
        from slb.buffer import read_header
        from slb.embedder import QINT8_SUFFIX

        try:
            quantized = QINT8_SUFFIX + "#" in read_header(path)["model_id"]
        except ValueError:
            quantized = False  # SLBuffer below reports the damage
        config = EmbedderConfig(quantize=True) if quantized else None
    embedder = Embedder(config).load()
    buf = SLBuffer(path, model_id=embedder.model_id)
    by_name = {t.name: t for t in (tools if tools is not None else registry_tools())}
    missing = [n for n in buf.names if n not in by_name]
    if missing:
        raise ValueError(f"the buffer names tools the registry no longer has ({missing[:3]}): run `nexus slb build`")
    entries = [by_name[n] for n in buf.names]
    cal = buf.calibration
    gate = GateConfig.from_calibration(cal)
    rr = None
    rr_dir = Path(reranker) if reranker else default_reranker_dir(entries, embedder.config.recipe)
    if reranker or rr_dir.is_dir():
        rr = Reranker(rr_dir)
    return Router(embedder, buf.index, entries, gate, rr, mode, duplicates=buf.duplicates)
