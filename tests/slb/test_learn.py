"""Learning from confirmed calls: learned examples in the store (capped, deduplicated, opt-out, gone with a
schema change), `nexus route --label` end to end, and the eval catalogue's learned rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from registry.store import RegistryStore
from slb.learn import ExampleLearner, LearnConfig

REPO = Path(__file__).resolve().parents[2]
TOOLS = [
    {"name": "flight_status", "description": "Status of a flight by its flight number.",
     "inputSchema": {"type": "object", "required": ["number"], "properties": {"number": {"type": "string"}}}},
    {"name": "hotel_search", "description": "Find hotels in a city for given dates.",
     "inputSchema": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}},
]


def test_learner_caps_dedups_and_opts_out(nexus_home, monkeypatch):
    with RegistryStore() as store:
        store.add_tools(TOOLS)
        learner = ExampleLearner(store, LearnConfig(cap=2))
        assert learner.confirm("is LH 400 on time", "flight_status")
        assert not learner.confirm("is  LH 400 on time", "flight_status")  # same text after normalization
        learner.confirm("where is BA 117", "flight_status")
        learner.confirm("UA 1 delayed?", "flight_status")
        learned = [e.text for e in store.examples()["flight_status"] if e.source == "learned"]
        assert learned == ["where is BA 117", "UA 1 delayed?"] and learner.learned == 3
        with pytest.raises(KeyError):
            learner.confirm("x", "no_such_tool")
        monkeypatch.setenv("NEXUS_LEARN", "0")
        off = ExampleLearner(store, LearnConfig.from_env())
        assert not off.config.enabled and not off.confirm("flight AF 8", "flight_status")
        assert off.confirm("flight AF 8", "flight_status", force=True)  # an explicit label still counts
        store.add_tools([{**TOOLS[0], "description": "Live status of a flight."}])  # schema change
        assert {e.source for e in store.examples()["flight_status"]} == {"template"}
    with pytest.raises(ValueError, match="cap"):
        LearnConfig(cap=0)


def _nexus(home, *args):
    env = dict(os.environ, NEXUS_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "nexus_agent.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)


def test_route_label_adds_a_row_the_next_route_matches(nexus_home, tmp_path):
    f = tmp_path / "tools.jsonl"
    f.write_text("".join(json.dumps(t) + "\n" for t in TOOLS))
    assert _nexus(nexus_home, "register", "--file", str(f)).returncode == 0
    assert _nexus(nexus_home, "slb", "build").returncode == 0
    query = "my cousin lands tonight, anything I should know about KL 1234"
    r = _nexus(nexus_home, "route", "--label", "flight_status", query, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["label"].startswith("learned (1 row embedded, buffer 3 rows)")
    d = json.loads(_nexus(nexus_home, "route", "--mode", "embed", query, "--json").stdout)
    assert d["tool"] == "flight_status" and d["score"] > 0.99  # the learned row is the query itself
    r = _nexus(nexus_home, "route", "--label", "nope", query)
    assert r.returncode == 1 and "nexus tools list" in r.stderr


def test_eval_catalogue_puts_learned_rows_beside_their_tools_rows():
    from evals.routing_registry import Catalogue

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cat = Catalogue(x, [[0], [1], [2]])
    assert cat.registry(np.array([2, 0]))[3] is None  # no learned rows: one row per tool
    cat.learned = {0: x[1:2] * 1.0}
    m8, sc, f32, row_tool = cat.registry(np.array([2, 0]))
    assert row_tool.tolist() == [0, 1, 1]  # tool 0 of the catalogue sits at registry position 1, two rows
    np.testing.assert_allclose(f32[2], x[1])


def test_buffer_is_out_of_date_once_an_example_is_learned(nexus_home):
    from slb.service import buffer_is_current, build

    with RegistryStore() as store:
        store.add_tools(TOOLS)
        assert not buffer_is_current(store)  # no buffer yet
        build(store)
        assert buffer_is_current(store)  # templated examples are not routed on: nothing to add
        ExampleLearner(store).confirm("is LH 400 on time", "flight_status")
        assert not buffer_is_current(store)
        r = build(store)
        assert buffer_is_current(store) and r.embedded == 0 and r.examples_embedded == 1 and r.rows == 3
