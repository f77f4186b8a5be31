"""Bad input, property-based: registry import, compressed signatures, argument validation and prompt rendering
never crash uncontrolled, never let a schema-invalid call through, and never let text forge chat markup."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nexus_agent.arguments.decoder import validate
from nexus_agent.prompts import answer_messages, argument_messages
from registry.model import Tool, ToolValidationError
from registry.servers.calculator import FUNCTIONS as CALCULATOR
from registry.servers.runtime import call_handler, handlers_from_functions
from registry.signature import compress, required_names_present
from registry.store import RegistryStore
from splice.prompt import segment_tokens

FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n"]

json_leaf = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False) | st.text(max_size=20)
json_value = st.recursive(json_leaf,
                          lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                          max_leaves=20)
names = st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True) | st.text(max_size=140)
prop_names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True) | st.text(min_size=1, max_size=12)
leaf_schema = st.sampled_from([{"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "number"},
                               {"type": "boolean"}, {"enum": ["a", "b", 3]},
                               {"type": "array", "items": {"type": "string"}}])
schemas = st.recursive(
    leaf_schema,
    lambda c: st.dictionaries(prop_names, c, min_size=1, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req})),
    max_leaves=8)
object_schemas = st.dictionaries(prop_names, schemas, max_size=5).flatmap(
    lambda props: st.lists(st.sampled_from(sorted(props)) if props else st.nothing(), unique=True).map(
        lambda req: {"type": "object", "properties": props, "required": req}))
texts = st.text(max_size=200) | st.lists(st.sampled_from(SPECIAL) | st.text(max_size=10), max_size=6).map("".join)
tool_docs = st.fixed_dictionaries(
    {"name": names, "inputSchema": object_schemas | json_value | st.dictionaries(st.text(max_size=6), json_value)},
    optional={"description": texts | json_value, "title": texts | json_value, "outputSchema": json_value,
              "annotations": json_value})


@FAST
@given(docs=st.lists(tool_docs | json_value, max_size=4))
def test_registry_import_only_rejects_with_clear_errors(docs):
    with tempfile.TemporaryDirectory() as tmp, RegistryStore(Path(tmp) / "r.sqlite") as store:
        report = store.add_tools(docs)  # must never raise for bad tools
        for e in report.rejected:
            assert isinstance(e, ToolValidationError) and e.rule and e.path.startswith("$")
        for name in report.added:
            stored = store.get_tool(name)
            assert stored is not None and stored == Tool.from_mcp(stored.to_mcp())


@pytest.mark.parametrize("doc, rule", [
    ({"name": "big", "description": "x" * 2_000_000, "inputSchema": {"type": "object"}}, "max-description-chars"),
    ({"name": "wide", "inputSchema": {"type": "object",
                                      "properties": {f"p{i}": {"type": "string", "description": "y" * 200}
                                                     for i in range(2000)}}}, "max-schema-bytes"),
    ({"name": "deep", "inputSchema": json.loads('{"type":"object","properties":{"a":' * 400 + '{}' + '}}' * 400)},
     "max-schema-depth"),
])
def test_huge_documents_are_rejected_by_rule(doc, rule):
    with pytest.raises(ToolValidationError) as e:
        Tool.from_mcp(doc)
    assert e.value.rule == rule


@FAST
@given(name=st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True), desc=texts, schema=object_schemas)
def test_signature_never_crashes_and_names_required_params(name, desc, schema):
    tool = Tool.from_mcp({"name": name, "description": desc, "inputSchema": schema})
    ir = compress(tool)
    assert ir.startswith(name) and required_names_present(tool, ir), ir


HANDLERS = {h.tool.name: h for h in handlers_from_functions(CALCULATOR)}
ARG_NAMES = ["a", "b", "numerator", "denominator", "expression", "x"]
numbers = st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
# well-typed values under the calculator's own names, any subset, often with a stray key: calls that pass the types
# and differ only in their keys (random values alone rarely pass, so an extra key was found only now and then)
typed_args = st.fixed_dictionaries({}, optional={"a": numbers, "b": numbers, "numerator": numbers,
                                                 "denominator": numbers, "expression": texts, "x": json_value})


@settings(FAST, max_examples=200)  # cheap (no model); a fixed-seed CI run finds a stray key well within this
@given(tool=st.sampled_from(sorted(HANDLERS)),
       args=typed_args | st.dictionaries(st.sampled_from(ARG_NAMES), json_value, max_size=3) | json_value)
@example(tool="evaluate", args={"x": None, "expression": ""})  # found by hypothesis: an open schema passed "x" on
def test_nothing_schema_invalid_reaches_a_tool(tool, args):
    h = HANDLERS[tool]
    accepted, problem = validate(json.dumps(args), h.tool.input_schema)
    if accepted is None:
        assert problem
        return
    assert isinstance(accepted, dict)
    _, error = call_handler(h, accepted)  # the server's own schema check must agree with the agent's
    assert error is None or not error.startswith("invalid arguments"), error


@FAST
@given(text=st.text(max_size=40))
def test_validate_rejects_non_json_with_a_message(text):
    accepted, problem = validate(text, {"type": "object"})
    assert (accepted is None) == bool(problem)


def _specials(tok, ids):
    return [tok.token_text(i) for i in ids if i in tok.special_ids]


@FAST
@given(desc=texts, name=st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True))
def test_description_cannot_break_out_of_its_segment(llamacpp_backend, desc, name):
    tok = llamacpp_backend.tokenizer
    tool = Tool.from_mcp({"name": name, "description": desc, "inputSchema": {"type": "object"}})
    ids = segment_tokens(tok, tool)
    assert _specials(tok, ids) == _specials(
        tok, segment_tokens(tok, Tool.from_mcp({"name": name, "inputSchema": {"type": "object"}})))


@FAST
@given(desc=texts, request_text=texts, observation=texts)
def test_signature_and_answer_prompts_keep_their_markup(llamacpp_backend, desc, request_text, observation):
    tok = llamacpp_backend.tokenizer
    tool = Tool.from_mcp({"name": "t", "description": desc, "inputSchema": {"type": "object"}})
    for msgs, plain in ((argument_messages(compress(tool), request_text), argument_messages("t()", "r")),
                        (answer_messages(request_text, [observation]), answer_messages("r", ["o"]))):
        assert _specials(tok, tok.encode_chat(msgs)) == _specials(tok, tok.encode_chat(plain))
