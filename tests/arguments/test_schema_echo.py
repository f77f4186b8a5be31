"""What would restate a value's schema (nexus_agent.arguments.schema_echo); the decode that refuses it runs on
the real Qwen model in tests/turn/test_decide.py (`test_no_value_restates_its_schema`)."""

from __future__ import annotations

from nexus_agent.arguments.schema_echo import Echo, compact, echoes


def test_compact_drops_whitespace_outside_strings_only():
    assert compact(b'{ "a" : "x, y",\n  "b": [1, 2]}') == b'{"a":"x, y","b":[1,2]}'
    assert compact(b'{"a": "say \\"hi there\\" ok", "b" :') == b'{"a":"say \\"hi there\\" ok","b":'


def test_a_value_of_no_type_may_be_neither_its_schema_nor_its_description():
    sub = {"description": "The data source object used to access the database."}
    found = echoes(sub, "dataSource", "resolve userspace1 using the data source `db2datasource`")
    by_text = {e.text: e.split for e in found}
    assert by_text[b'{"description":"The data source object '] == 0  # of no type: the `{` already commits
    assert by_text[b'{"dataSource":{"description":"The data source object '] == 0
    assert by_text[b'"The data source object u'] == 1
    assert Echo(b'"array"', 1) in found and Echo(b'"string"', 1) in found


def test_an_object_of_no_properties_commits_after_its_first_quote():
    sub = {"type": "object", "description": "A map of parameters."}
    found = echoes(sub, "params", "")
    assert Echo(b'{"type":"object"', 2) in found and Echo(b'{"params":{"type":"object"', 2) in found
    assert not any(e.text.startswith(b'"') for e in found)  # an object is never a string
    assert echoes({"type": "object", "properties": {"type": {"type": "string"}}}, "filter", "") == []


def test_type_names_the_request_or_description_says_are_values():
    said = echoes({"type": "string", "description": "The personality type."}, "type", "enfj personality type")
    assert Echo(b'"array"', 1) in said
    assert Echo(b'"integer"', 1) not in echoes({"type": "string"}, "to", "cast the column to an integer")
    listed = echoes({"type": "string", "description": "the target: string, number or boolean"}, "to", "")
    assert not {b'"string"', b'"number"', b'"boolean"'} & {e.text for e in listed}
    assert Echo(b"\"'", 1) in said and Echo(b'"`', 1) in said  # a string never opens with a quote of its own
    assert echoes({"type": "string", "enum": ["array", "object"]}, "kind", "") == []
    assert echoes({"type": "integer", "description": "How many days to add."}, "days", "") == []
