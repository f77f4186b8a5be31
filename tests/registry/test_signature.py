"""The compressed signature IR: format, determinism, required-name coverage (property), catalogue budget."""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.model import Tool
from registry.signature import compress, first_clause, ir_stats, required_names_present

CATALOG = __import__("pathlib").Path(__file__).resolve().parents[3] / "shared" / "data" / "routing" / "tools.jsonl"


def make(schema, description="Get the current weather for a city. Uses a public API.", name="get_weather"):
    return Tool.from_mcp({"name": name, "description": description, "inputSchema": schema})


def test_example_format():
    tool = make({"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["c", "f"], "default": "c"},
        "days": {"type": "integer", "default": 3},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                  "required": ["lat"]},
    }, "required": ["city", "where"]})
    assert compress(tool) == (
        "get_weather(city, where: {lat: num, lon?: num}, unit=c|f, days=3, hourly?: bool, tags?: [str])"
        " — get current weather"
    )


def test_first_clause():
    assert first_clause("Retrieves the 10-Q reports. Also other things.") == "retrieves 10-Q reports"
    assert first_clause("") == ""
    assert first_clause("Calculate the sum of two integers, and return it") == "calculate sum of two"


names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
leaf = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean"])}),
    st.fixed_dictionaries({"enum": st.lists(st.text(max_size=8), min_size=1, max_size=8, unique=True)}),
    st.fixed_dictionaries({"type": st.just("integer"), "default": st.integers(-5, 99)}),
    st.fixed_dictionaries({"type": st.just("array"), "items": st.fixed_dictionaries({"type": st.just("string")})}),
    st.just({}),
)
prop_schema = st.recursive(
    leaf,
    lambda inner: st.dictionaries(names, inner, max_size=4).map(lambda p: {"type": "object", "properties": p}),
    max_leaves=8,
)


@st.composite
def schemas(draw):
    props = draw(st.dictionaries(names, prop_schema, max_size=10))
    required = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
    extra = draw(st.lists(names, max_size=2, unique=True))  # required but undeclared names
    return {"type": "object", "properties": props, "required": required + [e for e in extra if e not in props]}


@settings(max_examples=300, deadline=None)
@given(schema=schemas(), description=st.text(max_size=200))
def test_every_required_name_appears_and_ir_is_deterministic(schema, description):
    tool = make(schema, description=description)
    ir = compress(tool)
    assert required_names_present(tool, ir), ir
    assert compress(Tool.from_mcp(json.loads(json.dumps(tool.to_json())))) == ir


def test_required_check_can_fail():
    tool = make({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    assert not required_names_present(tool, "get_weather(town) — weather")


@pytest.mark.skipif(not CATALOG.exists(), reason="public routing catalogue not present")
def test_catalogue_median_tokens_and_coverage():
    tools = [Tool.from_mcp(json.loads(line)) for line in CATALOG.read_text().splitlines() if line.strip()]
    stats = ir_stats(tools)
    assert stats["tools"] == len(tools) >= 250
    assert stats["median_tokens"] <= 24
    assert stats["required_coverage"] == 1.0
    # The IR must actually be shorter than the JSON schema it stands for.
    from native.tokenizer import load_tokenizer

    tk = load_tokenizer()
    full = statistics.median(len(tk.encode(json.dumps(t.to_mcp()))) for t in tools[:200])
    assert stats["median_tokens"] * 3 < full
