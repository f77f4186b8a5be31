"""The router end to end on the real MiniLM: auto / rerank / none paths, a tiny trained reranker, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slb.buffer import SLBuffer
from slb.build import build_buffer
from slb.gate import GateConfig
from slb.reranker import Reranker, RerankerTrainConfig, reranker_meta, trained_for
from slb.router import Router
from slb.synth import synthesize_queries
from slb.tools import as_entry

from .conftest import QUERIES, TOOLS


@pytest.fixture()
def buffer(tmp_path, embedder):
    path = tmp_path / "b.slb"
    build_buffer(TOOLS, embedder, path)
    return SLBuffer(path, model_id=embedder.model_id)


def test_embedding_routes_handwritten_queries(buffer, embedder):
    r = Router(embedder, buffer.index, [as_entry(t) for t in TOOLS], mode="embed")
    hits = [r.route(q).tool == gold for q, gold in QUERIES]
    assert np.mean(hits) >= 11 / 12


def test_floor_sends_chit_chat_to_none_and_tau_sends_close_calls_to_rerank(buffer, embedder):
    tools = [as_entry(t) for t in TOOLS]
    d = Router(embedder, buffer.index, tools, GateConfig(tau=0.0, floor=0.45)).route("lol ok, thanks buddy!")
    assert d.path == "none" and d.tool is None and d.score < 0.45
    d = Router(embedder, buffer.index, tools, GateConfig(tau=0.0, floor=-1.0)).route("Will it rain in Paris today?")
    assert d.path == "auto" and d.tool == "get_weather" and d.margin > 0
    assert set(d.timings) == {"embed_ms", "scan_ms", "rerank_ms", "total_ms"}
    # without a reranker a below-tau decision keeps the scan's top-1 but is not called "auto"
    d = Router(embedder, buffer.index, tools, GateConfig(tau=1.0, floor=-1.0)).route("Will it rain in Paris today?")
    assert d.path == "rerank" and d.tool == "get_weather" and d.candidates[0][2] is None


def test_synthesized_queries_mention_the_tool():
    import random

    qs = synthesize_queries(as_entry(TOOLS[2]), 3, random.Random(0))
    assert len(qs) == 3 and all(q for q in qs)
    assert any("triangle" in q.lower() for q in qs) and any("base" in q or "height" in q for q in qs)


@pytest.mark.slow
def test_tiny_reranker_trains_saves_reloads_and_reranks(tmp_path, buffer, embedder):
    from slb.service import train

    tools = [as_entry(t) for t in TOOLS]
    cfg = RerankerTrainConfig(queries_per_tool=3, max_steps=25, batch_size=2, negatives=5)
    out = tmp_path / "rr"
    meta = train(tools, embedder, [], cfg, out, progress=False)
    assert not meta["reused"] and meta["steps"] == 25 and reranker_meta(out)["fingerprint"] == meta["fingerprint"]
    again = train(tools, embedder, [], cfg, out, progress=False)
    assert again["reused"]  # same registry and config: no retraining
    other = RerankerTrainConfig(queries_per_tool=3, max_steps=2, batch_size=2, negatives=5)
    assert trained_for(out, tools, embedder.config.recipe, [], cfg)
    assert not trained_for(out, tools, embedder.config.recipe, [], other)  # another config: retrain, not reuse
    rr = Reranker(out)
    texts = [Router(embedder, buffer.index, tools)._texts[i] for i in range(len(tools))]
    s = rr.score("What is the area of a triangle with base 4 and height 3?", texts)
    assert s.shape == (12,) and int(np.argmax(s)) == 2  # 25 steps already learn the easy case
    d = Router(embedder, buffer.index, tools, GateConfig(tau=2.0, floor=-1.0, k=4, ce_weight=1.0), rr).route(
        "What is the area of a triangle with base 4 and height 3?")
    assert d.path == "rerank" and d.tool == "calc.triangle_area"
    assert all(c[2] is not None and c[3] is not None for c in d.candidates) and len(d.candidates) == 4
    # ce_weight 0: the cross-encoder is not called even when one is loaded
    d = Router(embedder, buffer.index, tools, GateConfig(tau=2.0, floor=-1.0, k=4, ce_weight=0.0), rr).route(
        "What is the area of a triangle with base 4 and height 3?")
    assert d.tool == "calc.triangle_area" and all(c[2] is None for c in d.candidates)


@pytest.mark.slow
def test_cli_build_train_calibrate_route(nexus_home, capsys):
    from nexus_agent.cli import main
    from registry.store import RegistryStore

    with RegistryStore() as store:
        store.add_tools(TOOLS)
    assert main(["slb", "build"]) == 0
    assert "12 tools (12 embedded, 0 reused" in capsys.readouterr().out
    assert main(["slb", "build"]) == 0
    assert "(0 embedded, 12 reused" in capsys.readouterr().out
    with RegistryStore() as store:
        assert store.stale_tools("slb") == []
    assert main(["slb", "train-reranker", "--steps", "3"]) == 0
    assert "trained in" in capsys.readouterr().out
    assert main(["slb", "train-reranker", "--steps", "3"]) == 0
    assert "reranker reused" in capsys.readouterr().out
    qfile = nexus_home / "q.jsonl"
    qfile.write_text("".join(json.dumps({"query": q, "gold_tool": g}) + "\n" for q, g in QUERIES))
    assert main(["slb", "calibrate", "--queries", str(qfile)]) == 0
    out = capsys.readouterr().out
    assert "tau=" in out and "on 12 queries" in out
    cal = SLBuffer(nexus_home / "slb" / "buffer.slb").calibration
    assert cal["queries"] == 12 and 0 <= cal["tau"] <= 2 and cal["lex_weight"] >= 0 and cal["ce_weight"] >= 0
    assert main(["route", "--json", "--mode", "rerank", "Convert 100 dollars to yen"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["path"] == "rerank" and all(c[3] is not None for c in d["candidates"])  # BM25 of every candidate
    assert all((c[2] is not None) == (cal["ce_weight"] > 0) for c in d["candidates"])  # CE only when weighted
    assert main(["route", "--json", "Convert 100 dollars to yen"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tool"] == "convert_currency" and d["path"] in ("auto", "rerank")
    # the route is timed apart from loading the models: two fields, no comparison of their values (a busy machine
    # can make either one the larger)
    assert set(d["timings"]) == {"embed_ms", "scan_ms", "rerank_ms", "total_ms"} and "load_ms" not in d["timings"]
    assert all(isinstance(v, (int, float)) and v >= 0 for v in [*d["timings"].values(), d["load_ms"]]), d
