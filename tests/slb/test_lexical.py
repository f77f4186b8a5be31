"""The lexical (BM25) term and its fusion with the cosine, on the real MiniLM and real catalogue tools."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from slb.buffer import SLBuffer
from slb.build import build_buffer
from slb.gate import GateConfig, fused_scores, pick_fusion_weights
from slb.lexical import LexicalIndex, normalized, terms
from slb.router import Router
from slb.tools import as_entry, tool_text

from .conftest import QUERIES, TOOLS

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "routing"
# a public query the scan gets wrong at 250 tools (find_flights by 0.016 cosine) and BM25 fixes ("book", "flight")
QUERY = ("Can you arrange a flight for me from New York, NY to Paris with a departure on the 20th of June 2022 "
         "at 5 in the afternoon?")
REGISTRY = ["find_flights", "book_flight", "concert_ticket.buy", "location.get_travel_time",
            "calculate_sunrise_and_sunset"]


@pytest.fixture(scope="module")
def catalogue():
    path = DATA / "tools.jsonl"
    if not path.exists():
        pytest.skip(f"public routing data not found at {path}")
    return {t.name: t for t in (as_entry(json.loads(line)) for line in path.open(encoding="utf-8") if line.strip())}


def test_terms_split_identifiers_drop_short_words_and_stem():
    assert terms("getUserInfo files_listing calc.final_velocity is a") == \
        ["get", "user", "info", "file", "list", "calc", "final", "velocity"]
    assert terms("Queries searches used booked ID") == ["query", "search", "used", "book"]
    assert terms("") == [] and terms("a b, c!") == []


def test_bm25_idf_comes_from_the_registry_rows(catalogue):
    tools = [catalogue[n] for n in REGISTRY]
    texts = [tool_text(t) for t in tools]
    ix = LexicalIndex(texts)
    s = ix.scores("book a flight", range(len(tools)))
    assert int(np.argmax(s)) == 1 and s[1] > s[0] > 0 and s[2] == 0  # both words beat "flight" alone
    # "flight" is in 2 of these 5 tools: rarer (higher IDF) in a registry where only one tool has it
    assert ix.df("flight") == 2 and ix.subset([1, 2, 3]).df("flight") == 1
    assert ix.subset([1, 2, 3]).idf("flight") > ix.idf("flight")
    # a subset scores exactly as an index built from those texts alone
    rows = [4, 1, 3]
    assert np.allclose(ix.subset(rows).scores(QUERY, [0, 1, 2]),
                       LexicalIndex([texts[i] for i in rows]).scores(QUERY, [0, 1, 2]))
    # BM25 saturates in term frequency and normalizes by length
    short, long_ = LexicalIndex(["hotel booking", "hotel booking " + "misc words here " * 10]).scores("hotel", [0, 1])
    assert short > long_ > 0
    assert np.array_equal(normalized(np.array([[0.0, 0.0], [1.0, 4.0]])), [[0, 0], [0.25, 1]])


def test_router_lexical_term_changes_the_choice(embedder, tmp_path, catalogue):
    tools = [catalogue[n] for n in REGISTRY]
    build_buffer(tools, embedder, tmp_path / "b.slb")
    index = SLBuffer(tmp_path / "b.slb", model_id=embedder.model_id).index
    cos_only = Router(embedder, index, tools, GateConfig(tau=2.0, floor=-1.0, lex_weight=0.0)).route(QUERY)
    fused = Router(embedder, index, tools, GateConfig(tau=2.0, floor=-1.0, lex_weight=0.15)).route(QUERY)
    assert cos_only.path == fused.path == "rerank"
    assert cos_only.tool == cos_only.candidates[0][0] == "find_flights"  # the scan's top-1
    assert fused.tool == "book_flight"
    lex = {c[0]: c[3] for c in fused.candidates}
    assert max(lex, key=lex.get) == "book_flight" and all(c[2] is None for c in fused.candidates)  # no CE called
    # above tau the scan's top-1 is taken without the lexical term
    auto = Router(embedder, index, tools, GateConfig(tau=0.0, floor=-1.0, lex_weight=0.15)).route(QUERY)
    assert auto.path == "auto" and auto.tool == "find_flights" and auto.candidates[0][3] is None


def test_fusion_weights_validated_fitted_and_old_calibrations_read():
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lex_weight"):
            GateConfig(lex_weight=bad)
        with pytest.raises(ValueError, match="ce_weight"):
            GateConfig(ce_weight=bad)
    g = GateConfig.from_calibration({"tau": 0.05, "floor": 0.2, "k": 10, "rerank_weight": 5.0})
    assert g.lex_weight == 0 and math.isclose(g.ce_weight, 0.2)  # old order logit + 5 cos == cos + 0.2 logit
    assert GateConfig.from_calibration({"rerank_weight": 0.0}).ce_weight > 100  # logits only
    g = GateConfig.from_calibration({"tau": 0.05, "lex_weight": 0.15, "ce_weight": 0.0, "target": 0.97})
    assert (g.tau, g.lex_weight, g.ce_weight) == (0.05, 0.15, 0.0)
    # cosine already right: simplest weights; lexical fixes the close calls: a positive lex weight, no CE
    cos = np.array([[0.50, 0.49, 0.1], [0.60, 0.30, 0.2], [0.40, 0.39, 0.1]])
    lex = np.array([[1.0, 5.0, 0.0], [3.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    logits = np.zeros_like(cos)
    assert pick_fusion_weights(cos, lex, logits, np.array([0, 0, 0])) == (0.0, 0.0)
    w, c = pick_fusion_weights(cos, lex, logits, np.array([1, 0, 1]))
    # c and w are values of the search grid (exact by construction); the argmax has margins of >= 0.01
    assert c == 0.0 and 0 < w and np.array_equal(np.argmax(fused_scores(cos, lex, None, w, 0), 1), [1, 0, 1])
    with pytest.raises(ValueError):
        pick_fusion_weights(cos, lex[:, :2], None, np.array([0, 0, 0]))


def test_calibrate_stores_fusion_weights_and_open_router_uses_them(nexus_home, embedder):
    from slb.service import buffer_path, calibrate, open_router

    tools = [as_entry(t) for t in TOOLS]
    build_buffer(tools, embedder, buffer_path())
    cal = calibrate(tools, list(QUERIES), embedder, buffer_path())
    stored = SLBuffer(buffer_path()).calibration
    # the same numbers written and read back (a round trip, not a recomputation); ce_weight 0: no reranker trained
    assert stored["lex_weight"] == cal["lex_weight"] and stored["ce_weight"] == 0.0
    assert "rerank_weight" not in stored
    r = open_router(tools=tools)
    assert r.gate.lex_weight == cal["lex_weight"] and r.gate.tau == cal["tau"] and r.reranker is None


def test_lexical_text_reads_the_whole_schema(catalogue):
    from slb.tools import ToolEntry, lexical_text

    t = ToolEntry("book_seat", "Reserve a seat.", {"type": "object", "properties": {
        "cabin": {"type": "string", "description": "Travel class of the ticket", "enum": ["Economy", "Business"]},
        "passenger": {"type": "object", "properties": {"frequent_flyer_id": {"type": "string"}}},
        "legs": {"type": "array", "items": {"type": "object", "properties": {"airport_code": {"type": "string"}}}}}})
    words = set(terms(lexical_text(t)))
    assert set(terms("book seat reserve cabin travel class economy business passenger frequent flyer legs "
                     "airport code")) <= words
    assert not {"economy", "travel", "airport"} & set(terms(tool_text(t, "name_desc_params")))  # names only
    # a query naming an enum value matches it only through the schema text; the router indexes that text
    ix = LexicalIndex([lexical_text(t), lexical_text(catalogue["book_flight"])])
    assert ix.scores("a business class seat please", [0, 1])[0] > 0


def test_schema_recipe_embeds_descriptions_and_enums_of_top_level_parameters():
    from slb.embedder import Embedder, EmbedderConfig
    from slb.tools import ToolEntry

    t = ToolEntry("book_seat", "Reserve a seat.", {"type": "object", "required": ["passenger", "cabin"], "properties": {
        "note": {"type": "string"},
        "cabin": {"type": "string", "description": "Travel class of the ticket.", "enum": ["Economy", "Business"]},
        "passenger": {"type": "object", "properties": {"frequent_flyer_id": {"type": "string"}}}}})
    # required first, as `required` lists them
    assert tool_text(t, "schema") == ("book seat: Reserve a seat. Parameters: passenger; cabin (Travel class of the "
                                      "ticket) one of Economy, Business; note.")
    assert tool_text(ToolEntry("ping", "Check."), "schema") == "ping: Check."
    with pytest.raises(ValueError, match="unknown tool text recipe"):
        tool_text(t, "everything")
    # the real embedder: a request naming the enum value is closer to the schema text than to the names-only text
    q = "I need a business class seat"
    vecs = {r: Embedder(EmbedderConfig(recipe=r)) for r in ("schema", "name_desc_params")}
    cos = {r: float(e.embed_tools([t])[0] @ e.embed_query(q)) for r, e in vecs.items()}
    assert cos["schema"] > cos["name_desc_params"] + 0.05, cos
