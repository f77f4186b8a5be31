"""llguidance-constrained decoding over our tokenizer on the real packaged model: always schema-valid JSON."""

from __future__ import annotations

import json

import jsonschema
import pytest

from nexus_agent.arguments.constrained import _TokenList, generate_json

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
    {"type": "object", "properties": {"unit": {"enum": ["km", "mi", "m"]}, "value": {"type": "number"}},
     "required": ["unit", "value"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                      "note": {"type": "object", "properties": {"title": {"type": "string"}},
                                               "required": ["title"]}},
     "required": ["tags", "note"]},
]


def test_token_list_round_trips_bytes(llamacpp_backend):
    tok = llamacpp_backend.tokenizer
    tl = _TokenList(tok)
    ids = tok.encode("Grüße, 12°C — naïve ✓")
    assert b"".join(tl.tokens[i] for i in ids).decode("utf-8") == "Grüße, 12°C — naïve ✓"


@pytest.mark.parametrize("schema", SCHEMAS, ids=["ints", "enum", "nested"])
def test_output_is_schema_valid(llamacpp_backend, schema):
    tok = llamacpp_backend.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "Give the arguments as JSON: 7 km, add 3 and 4, a note."}])
    s = llamacpp_backend.new_session(1024)
    try:
        r = generate_json(s, prompt, schema, tok, max_tokens=80)
    finally:
        s.close()
    assert r.error is None and r.complete, r
    jsonschema.validate(json.loads(r.text), schema)
    assert r.ttft_s > 0


def test_token_limit_gives_incomplete_json(llamacpp_backend):
    tok = llamacpp_backend.tokenizer
    s = llamacpp_backend.new_session(512)
    try:
        r = generate_json(s, tok.encode("args:"), SCHEMAS[0], tok, max_tokens=2)
    finally:
        s.close()
    assert not r.complete
    with pytest.raises(ValueError):
        json.loads(r.text)


def test_json_is_closed_before_the_token_limit(llamacpp_backend):
    """A request with many copyable words makes the model list them in an array until the limit cuts the JSON;
    in its last tokens the loop guard prefers closers wherever the grammar allows one, so it ends complete."""
    from nexus_agent.arguments.copy_sources import Source
    from nexus_agent.arguments.copying import CopyBias

    tok = llamacpp_backend.tokenizer
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["tags"]}
    request = "Tag it with " + " ".join(f"w{i}" for i in range(60))
    ids = tok.encode_chat([{"role": "user", "content": f"tag(tags: [str]) — {request}"}])
    s = llamacpp_backend.new_session(1024)
    try:
        r = generate_json(s, ids, schema, tok, max_tokens=40,
                          processors=[CopyBias(tok, [Source("request", request)], schema, 4.0)])
    finally:
        s.close()
    assert r.complete and len(r.tokens) <= 40, r.text
    jsonschema.validate(json.loads(r.text), schema)


@pytest.mark.slow
def test_mlx_backend_same_constraint(mlx_backend):
    tok = mlx_backend.tokenizer
    s = mlx_backend.new_session(512)
    try:
        r = generate_json(s, tok.encode_chat([{"role": "user", "content": "7 km as JSON"}]), SCHEMAS[1], tok)
    finally:
        s.close()
    jsonschema.validate(json.loads(r.text), SCHEMAS[1])


def test_a_larger_budget_goes_on_with_the_same_decode(llamacpp_backend):
    """A document the grammar cannot close within `max_tokens` (eight sizes required, then the id) is cut there;
    with `extend_to` the same decode goes on (its first tokens are the cut ones: what was streamed stays a
    prefix) and ends complete and valid."""
    tok = llamacpp_backend.tokenizer
    schema = {"type": "object", "properties": {"sizes": {"type": "array", "items": {"type": "string"}, "minItems": 8},
                                               "product_id": {"type": "string"}}, "required": ["sizes", "product_id"]}
    ids = tok.encode_chat([{"role": "user", "content": "Check sizes S, M, L and XL of product SK123."}])
    runs = []
    for extend_to in (None, 160):
        s = llamacpp_backend.new_session(1024)
        try:
            runs.append(generate_json(s, ids, schema, tok, max_tokens=16, extend_to=extend_to))
        finally:
            s.close()
    cut, extended = runs
    assert cut.cut and not cut.extended and len(cut.tokens) == 16
    assert extended.complete and extended.extended and extended.tokens[:16] == cut.tokens, extended.text
    jsonschema.validate(json.loads(extended.text), schema)


def test_grammar_enforces_tells_whether_a_valid_document_can_fail_the_schema():
    from nexus_agent.arguments.constrained import grammar_enforces

    assert grammar_enforces(SCHEMAS[2])
    assert not grammar_enforces({"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}})


def test_tokens_the_grammar_forces_are_fed_in_one_pass_with_the_same_text(llamacpp_backend, monkeypatch):
    """Required properties with long names: after `{` the grammar forces `"destination_city_name":` and the rest;
    those tokens go in with one forward pass (`GrammarMask.ahead`) and the document is the one decoded token by
    token."""
    from nexus_agent.arguments import constrained

    schema = {"type": "object", "required": ["destination_city_name", "number_of_travelling_adults"],
              "properties": {"destination_city_name": {"type": "string"},
                             "number_of_travelling_adults": {"type": "integer"}}, "additionalProperties": False}
    tok = llamacpp_backend.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "Book a trip to Lisbon for 2 adults. Arguments as JSON:"}])

    def run() -> tuple[str, int]:
        s = llamacpp_backend.new_session(1024)
        decodes = 0
        single = s.decode

        def counted(token):
            nonlocal decodes
            decodes += 1
            return single(token)

        s.decode = counted
        try:
            r = generate_json(s, prompt, schema, tok, max_tokens=60)
        finally:
            s.close()
        assert r.complete, r
        return r.text, decodes

    fed_text, fed_decodes = run()
    monkeypatch.delattr(constrained.GrammarMask, "ahead")
    text, decodes = run()
    assert fed_text == text and json.loads(text)["destination_city_name"]
    assert fed_decodes + 8 <= decodes, (fed_decodes, decodes)  # the two names and their quotes, at least
