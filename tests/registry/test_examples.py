"""Example requests per tool: templated at registration from schema fields, user examples from tool files and
the CLI, learned ones capped; all versioned with the schema hash and kept across restarts."""

from __future__ import annotations

import json

import pytest

from registry.examples import MAX_TEMPLATES, template_examples
from registry.store import RegistryStore

from .test_cli import nexus
from .test_store import tool_dict

WEATHER = {"name": "get_weather", "description": "Returns the current weather for a city. Data from a public API.",
           "inputSchema": {"type": "object", "required": ["city"], "properties": {
               "city": {"type": "string", "description": "The city name"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}


def test_templates_come_from_schema_fields_only_and_are_deterministic():
    t = template_examples(WEATHER["name"], WEATHER["description"], WEATHER["inputSchema"])
    assert t == template_examples(WEATHER["name"], WEATHER["description"], WEATHER["inputSchema"])
    assert 2 <= len(t) <= MAX_TEMPLATES and len(set(t)) == len(t)
    assert t[0] == "return the current weather for a city"  # first sentence, verb in base form
    assert "get weather with city" in t and "get weather unit celsius" in t
    assert template_examples("ping", "", {}) == ["ping"]  # a bare name still gives one request


def test_examples_are_versioned_with_the_schema_and_survive_restart(nexus_home):
    with RegistryStore() as store:
        store.add_tools([{**WEATHER, "examples": ["will it rain in  Oslo tomorrow?"]}])
        ex = store.examples()["get_weather"]
        assert [e.source for e in ex][-1] == "user" and ex[-1].text == "will it rain in Oslo tomorrow?"
        assert {e.source for e in ex} == {"template", "user"}
        assert store.add_examples("get_weather", ["is it sunny in Rome", "will it rain in Oslo tomorrow?"]) == 1
    with RegistryStore() as store:  # a new process would see the same rows
        ex = store.examples("get_weather")["get_weather"]
        assert "is it sunny in Rome" in [e.text for e in ex]
        store.add_tools([{**WEATHER}])  # unchanged schema: examples stay
        assert "is it sunny in Rome" in [e.text for e in store.examples()["get_weather"]]
        changed = {**WEATHER, "description": "Returns the weather forecast for a city."}
        assert store.add_tools([changed]).updated == ["get_weather"]
        ex = store.examples()["get_weather"]
        assert {e.source for e in ex} == {"template"} and ex[0].text == "return the weather forecast for a city"
        assert all(e.schema_hash == store.get_tool("get_weather").schema_hash for e in ex)
        store.remove_tool("get_weather")
        assert store.examples() == {}


def test_learned_examples_are_capped_and_deduplicated(store):
    store.add_tools([tool_dict("a")])
    for i in range(6):
        store.add_examples("a", [f"request {i}", f"request {i}"], "learned", cap=4)
    learned = [e.text for e in store.examples()["a"] if e.source == "learned"]
    assert learned == ["request 2", "request 3", "request 4", "request 5"]  # the oldest dropped first
    with pytest.raises(KeyError, match="nexus tools list"):
        store.add_examples("nope", ["x"])
    with pytest.raises(ValueError, match="empty"):
        store.add_examples("a", ["   "])


def test_bad_examples_field_rejects_only_that_tool(store):
    r = store.add_tools([{**tool_dict("a"), "examples": "not a list"}, tool_dict("b")])
    assert r.added == ["b"] and r.rejected[0].path == "$.examples"


def _nexus(home, *args):
    return nexus(*args, home=home)


def test_cli_examples_add_list_show(nexus_home, tmp_path):
    f = tmp_path / "tools.jsonl"
    f.write_text(json.dumps({**WEATHER, "examples": ["weather in Paris"]}) + "\n")
    assert _nexus(nexus_home, "register", "--file", str(f)).returncode == 0
    r = _nexus(nexus_home, "tools", "examples", "add", "get_weather", "how cold is it in Oslo")
    assert r.returncode == 0 and "1 example(s) added" in r.stdout
    shown = json.loads(_nexus(nexus_home, "tools", "show", "get_weather", "--json").stdout)
    texts = {e["text"]: e["source"] for e in shown["examples"]}
    assert texts["weather in Paris"] == "user" and texts["how cold is it in Oslo"] == "user"
    assert "template" in texts.values()
    printed = _nexus(nexus_home, "tools", "show", "get_weather").stdout
    assert "[user] how cold is it in Oslo" in printed
    listed = _nexus(nexus_home, "tools", "examples", "list", "get_weather").stdout
    assert "[template] return the current weather for a city" in listed
    assert _nexus(nexus_home, "tools", "examples", "add", "nope", "x").returncode == 1
    r = _nexus(nexus_home, "tools", "examples", "remove", "get_weather", "--source", "user")
    assert "2 example(s) removed" in r.stdout
