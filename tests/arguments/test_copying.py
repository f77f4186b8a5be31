"""Copy-aware argument decoding (nexus_agent.arguments.copying) on the real packaged model, one test per copy source,
and a property test that no copied value ever breaks the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_agent.arguments.constrained import generate_json
from nexus_agent.arguments.copy_sources import Source, name_words, names_word, numbers_in, value_sources
from nexus_agent.arguments.copying import CopyBias
from nexus_agent.arguments.drafts import copy_processors
from nexus_agent.arguments.json_cursor import JsonCursor
from nexus_agent.arguments.value_scores import extends_copy, respells_copy
from nexus_agent.prompts import argument_messages


def test_cursor_follows_paths_and_values():
    c = JsonCursor()
    seen = []
    for ch in '{"a": 12, "note": {"title": "x\\"y", "tags": ["p", 3]}}':
        seen.append((c.path(), c.value_prefix()))
        c.feed(ch.encode())
    assert ((), b"") in seen  # the root value may start
    assert (("a",), b"1") in seen
    assert (("note", "title"), b'"x\\"') in seen  # an escaped quote does not end the string
    assert (("note", "tags", "[]"), b'"p') in seen
    assert (("note", "tags", "[]"), b"3") in seen
    assert not any(p and (b"title" in p or b"tags" in p) for _, p in seen)  # keys are never values
    assert c.value_prefix() is None and c.root_done


def test_cursor_knows_keys_and_member_ends():
    c = JsonCursor()
    c.feed(b'{')
    assert c.key_prefix() == b"" and not c.member_done()
    c.feed(b'"que')
    assert c.key_prefix() == b'"que' and c.value_prefix() is None
    c.feed(b'ry": "music"')
    assert c.member_done() and c.keys_written() == ["query"] and c.key_prefix() is None
    c.feed(b', "tags": ["a"')
    assert c.keys_written() == [] and not c.member_done()  # inside the array: no object member here
    c.feed(b"]")
    assert c.member_done() and c.keys_written() == ["query", "tags"]


def test_request_words_name_parameters_by_stem():
    assert name_words("repo_path") == ["repo", "path"] and name_words("noteId") == ["note", "id"]
    assert names_word("ID", ["id"]) and not names_word("is", ["id"])
    assert names_word("titled", ["title"]) and names_word("repository", ["repo"]) and names_word("tags", ["tag"])
    assert not names_word("notes", ["tag"]) and not names_word("date", ["days"]) and not names_word("at", ["path"])


def test_numbers_in_text():
    assert numbers_in("Add 1,250 and -3.5 to 7, not v2 or 1.2.3") == [b"1250", b"-3.5", b"7"]


def test_value_sources_names_each_origin():
    schema = {"type": "object", "properties": {"unit": {"enum": ["km", "mi"]}, "n": {"type": "integer", "default": 1},
                                               "x": {"type": "number"}, "s": {"type": "string"}}}
    src = [Source("request", "convert 12 in notes.md"), Source("observation", 'returned {"result": 42.0}')]
    got = value_sources({"unit": "km", "n": 1, "x": 42, "s": "notes.md"}, src, schema)
    assert got == {"unit": "enum", "n": "default", "x": "observation", "s": "request"}
    assert value_sources({"s": "invented"}, src, schema) == {"s": "generated"}


def _decode(backend, schema, request, sources=None, bias=4.0, results=None, sig="t(x)"):
    tok = backend.tokenizer
    ids = tok.encode_chat(argument_messages(sig, request, results))
    sources = sources if sources is not None else [Source("request", request)]
    s = backend.new_session(2048)
    try:
        procs = copy_processors(tok, sources, schema, bias, s) if bias else []  # the agent's: ranked, drafted
        r = generate_json(s, ids, schema, tok, 96, processors=procs)
    finally:
        s.close()
    assert r.error is None and r.complete, r
    value = json.loads(r.text)
    jsonschema.validate(value, schema)
    return value


NUMBERS = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}
PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


@pytest.mark.parametrize("path", ["data.csv", "notes/plan.md", "/tmp/x-7/repo_a"])
def test_copies_a_request_span(llamacpp_backend, path):
    value = _decode(llamacpp_backend, PATH_SCHEMA, f"Read the file {path}", sig="read_file(path: str) — read a file")
    assert value == {"path": path}


def test_copies_numbers_from_the_request(llamacpp_backend):
    schema = NUMBERS
    value = _decode(llamacpp_backend, schema, "Multiply 993 by 490", sig="multiply(a: num, b: num) — multiply")
    assert value == {"a": 993, "b": 490}


def test_copies_an_earlier_result(llamacpp_backend):
    schema = NUMBERS
    obs = 'add returned: {"result": 42.0}'  # as loop.result_text shows an earlier call
    step = "multiply the result by 3"
    value = _decode(llamacpp_backend, schema, step, [Source("request", step), Source("observation", obs)],
                    results=[obs], sig="multiply(a: num, b: num) — multiply two numbers")
    assert sorted(value.values()) == [3, 42]
    assert set(value_sources(value, [Source("request", step), Source("observation", obs)], schema).values()) == {
        "request", "observation"}


def test_a_step_that_names_its_own_number_takes_it(llamacpp_backend):
    """`make demo`'s second step: after add returned 42, "convert 5 km to mi" took value 42 (the earlier result
    outscored the request's 5); the request names a number for every numeric key, so it is the step's own."""
    schema = {"type": "object", "properties": {"value": {"type": "number"}, "from_unit": {"type": "string"},
                                               "to_unit": {"type": "string"}},
              "required": ["value", "from_unit", "to_unit"]}
    obs = 'add returned: {"result": 42}'
    step = "convert 5 km to mi"
    value = _decode(llamacpp_backend, schema, step, [Source("request", step), Source("observation", obs)],
                    results=[obs], sig="convert(value: num, from_unit: str, to_unit: str) — convert units")
    assert value["value"] == 5


def test_picks_the_enum_value_the_request_names(llamacpp_backend):
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]}},
              "required": ["city", "unit"]}
    value = _decode(llamacpp_backend, schema, "What is the temperature in Oslo in Kelvin?",
                    sig='weather(city: str, unit: "celsius"|"fahrenheit"|"kelvin") — current temperature')
    assert value == {"city": "Oslo", "unit": "kelvin"}


NOTE = {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"},
                                        "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["title", "body"]}


@pytest.mark.parametrize("word", ["apples", "travel"])
def test_a_value_ends_where_the_next_parameter_is_named(llamacpp_backend, word):
    """Untilted, the model runs the title on into the next value ("apples with the body") or takes the
    quoted body twice; the anchors (the word before a span names its parameter) and joiners end it."""
    value = _decode(llamacpp_backend, NOTE, f"Add a note titled {word} with the body 'buy {word}'",
                    sig="add_note(title, body, tags?: [str]) — save new note")
    assert value == {"title": word, "body": f"buy {word}"}


GIT_ADD = {"type": "object", "properties": {"repo_path": {"type": "string"},
                                           "files": {"type": "array", "items": {"type": "string"}}},
           "required": ["repo_path", "files"]}
TIMEZONE = {"type": "object", "properties": {"timezone": {"type": "string",
                                                          "description": "IANA timezone name"}},
            "required": ["timezone"]}


@pytest.mark.parametrize("backend_name", ["llamacpp-smollm2", "llamacpp-qwen"])
def test_an_array_ends_after_the_items_the_request_lists(llamacpp_backend, qwen_backends, backend_name):
    """A string array took copy after copy ("notes.txt", "repo", "file", "at PATH", ...) until the token limit:
    after an item that no comma or list word follows in the request, the array closes."""
    backend = llamacpp_backend if backend_name.endswith("smollm2") else qwen_backends("llamacpp")
    sig = "git_add(repo_path: str, files: [str]) — stage files"
    one = _decode(backend, GIT_ADD, "Stage the file notes.txt in the repo at /tmp/r", sig=sig)
    assert one["files"] == ["notes.txt"]
    two = _decode(backend, GIT_ADD, "Stage a.txt and b.txt in the repo at /tmp/r", sig=sig)
    # a listed item is followed by the next one; SmolLM2 starts this list at b.txt (its first pick, not the close)
    assert two["files"][-1] == "b.txt" and len(two["files"]) == len(set(two["files"]))
    if backend_name.endswith("qwen"):
        assert two["files"] == ["a.txt", "b.txt"]


STDDEV = {"type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "number"}}},
          "required": ["numbers"]}


def test_a_number_array_ends_after_the_numbers_the_request_lists(qwen_backends):
    """A number array after its last listed number chose between `,` and `]` by a near tie (BFCL exec_simple_18:
    the ten prices, then 10, 20000, 15000, ... to the token limit); the request's own list decides, and in a
    matrix a `]` right after a number closes that row only."""
    backend = qwen_backends("llamacpp")
    request = ("I need the standard deviation of its daily closing prices over the past 10 trading days. Here are "
               "the figures: 1000, 2000, 3000, 4000, 5000, 7000, 9000, 15000, 20000, and 30000. Can you help?")
    value = _decode(backend, STDDEV, request, sig="calculate_standard_deviation(numbers: [num])")
    assert value["numbers"] == [1000, 2000, 3000, 4000, 5000, 7000, 9000, 15000, 20000, 30000]
    value = _decode(backend, MATRIX, "Transpose the matrix [[1, 2], [3, 4], [5, 6]] for me",
                    sig="transpose(rows: int[][])")
    assert value["rows"] == [[1, 2], [3, 4], [5, 6]]


BUDGET = {"type": "object", "properties": {"budget": {"type": "integer"}}, "required": ["budget"]}


@pytest.mark.parametrize("backend_name", ["llamacpp-smollm2", "llamacpp-qwen"])
def test_a_copied_number_keeps_its_run_of_zeros(llamacpp_backend, qwen_backends, backend_name):
    """BFCL multiple_128 ("shareholder's equity of $10,000,000"): the copy was ranked whole, but the loop guard took
    the seventh `0` in a row for a loop and closed the number at 1000000; a digit run inside a number is bounded by
    the digit caps, not by the loop guard."""
    backend = llamacpp_backend if backend_name.endswith("smollm2") else qwen_backends("llamacpp")
    value = _decode(backend, BUDGET, "Plan the campaign with a budget of $10,000,000.",
                    sig="plan_campaign(budget: int) — plan a campaign")
    assert value == {"budget": 10000000}


@pytest.mark.parametrize("backend_name", ["llamacpp-smollm2", "llamacpp-qwen"])
def test_the_word_that_names_a_parameter_is_not_its_value(llamacpp_backend, qwen_backends, backend_name):
    backend = llamacpp_backend if backend_name.endswith("smollm2") else qwen_backends("llamacpp")
    value = _decode(backend, TIMEZONE, "Tell me the current time in the America/New_York timezone.",
                    sig="get_current_time(timezone: str) — current time in a timezone")
    assert value["timezone"] != "timezone"


def test_a_value_the_model_knows_more_of_than_the_request_writes_is_the_models(qwen_backends):
    """"Tokyo" is a copy, but the 0.5B puts 0.74 on `Asia` at the value's start: its own value `Asia/Tokyo` ends with
    the copy after a separator, so it is left to the model with the bias off (with the bias the copy won: "Tokyo")."""
    value = _decode(qwen_backends("llamacpp"), TIMEZONE, "What time is it in Tokyo right now?",
                    sig="get_current_time(timezone: str) — current time in a timezone")
    assert value == {"timezone": "Asia/Tokyo"}
    assert extends_copy(b"Asia/Tokyo", b"Tokyo") and extends_copy(b"repo:main", b"main")
    assert not extends_copy(b"Tokyo", b"Tokyo") and not extends_copy(b"Tokyo, Japan", b"Tokyo")
    assert not extends_copy(b"NewTokyo", b"Tokyo") and not extends_copy(b"/x", b"x")


EXPRESSION = {"type": "object", "properties": {"expression": {"type": "string", "title": "Expression"}},
              "required": ["expression"]}


def test_a_value_the_model_writes_in_its_own_form_from_the_request_is_the_models(qwen_backends):
    """The calculator server's `calculate(expression)` (held-out probe): the 0.5B starts "23" on its own, a copy
    start, and the ranking copied the request's prose "23 times 47 plus 12" (the server: invalid syntax). Its own
    value takes every value of the copy and no word the request does not write: it is the model's."""
    value = _decode(qwen_backends("llamacpp"), EXPRESSION, "What's 23 times 47 plus 12?",
                    sig="calculate(expression) — calculates/evaluates the given expression")
    assert value["expression"].replace(" ", "") == "23*47+12"
    words = {b"what", b"s", b"23", b"times", b"47", b"plus", b"12", b"the", b"orders", b"table", b"tmp", b"x", b"7",
             b"repo_a", b"lunch", b"plans"}
    assert respells_copy(b"23 * 47 + 12", b"23 times 47 plus 12", words)
    assert respells_copy(b"orders", b"the orders table", words)
    assert not respells_copy(b"23 times 47 plus 12", b"23 times 47 plus 12", words)  # the copy itself
    assert not respells_copy(b"23 * 47 + 13", b"23 times 47 plus 12", words)  # a number the request does not write
    assert not respells_copy(b"x-7/repo_a", b"/tmp/x-7/repo_a", words)  # a path cut: not the copy's value whole
    assert not respells_copy(b"23 * 47", b"23 times 47 plus 12", words)  # a value of the copy dropped
    assert not respells_copy(b"Lunch plans 23", b"Lunch plans", words)  # a value the copy does not take


def test_optional_keys_the_request_does_not_name_are_left_out(llamacpp_backend):
    """Both keys optional: the first (the main parameter) gets the value, and the `tag` the request never
    mentions is not filled with a word of the tool's own name."""
    schema = {"type": "object", "properties": {"query": {"type": "string", "default": ""}, "tag": {"type": "string"}}}
    sig = "search_notes(query?, tag?) — find notes whose title or body contains text"
    assert _decode(llamacpp_backend, schema, "Search my notes for music", sig=sig) == {"query": "music"}
    assert _decode(llamacpp_backend, schema, "Search my notes for music with the tag work", sig=sig) == {
        "query": "music", "tag": "work"}


FILMS = {"type": "object", "properties": {
    "director": {"type": "string", "default": "any"},
    "genre": {"type": "string", "enum": ["any", "Comedy", "Fantasy", "Horror", "Offbeat", "Drama"], "default": "any"},
    "cast": {"type": "string", "default": "any"}}}


@pytest.mark.parametrize("backend_name", ["llamacpp-smollm2", "llamacpp-qwen"])
def test_the_first_key_is_not_past_one_the_request_names(llamacpp_backend, qwen_backends, backend_name):
    """Keys are written in the schema's order, so a first key past one the request names loses that one: the
    0.5B Qwen opened BFCL's movie searches with `cast` (4-5 logits above the others) and wrote the director into
    it (`{"cast": "Wright"}` for "a comedy movie directed by Edgar Wright")."""
    backend = llamacpp_backend if backend_name.endswith("smollm2") else qwen_backends("llamacpp")
    sig = "find_movies(director=any, genre=any|Comedy|Fantasy|Horror|…, cast=any) — retrieves a list of movies"
    value = _decode(backend, FILMS, "Can you find me an offbeat movie directed by Wes Anderson?", sig=sig)
    assert list(value)[0] == "director" and value["director"] == "Wes Anderson", value


CLEANERS = {"type": "object", "properties": {
    "available_for_pet": {"type": "boolean", "default": False}, "avg_rating": {"type": "number"},
    "district_name": {"type": "string"}, "end_date": {"type": "string"},
    "has_quality_problem": {"type": "boolean", "default": False}, "is_cleaning_home": {"type": "boolean"},
    "job_qty": {"type": "integer"}, "max_age": {"type": "integer"}, "sub_district_name": {"type": "string"}}}


@pytest.mark.parametrize("backend_name", ["llamacpp-smollm2", "llamacpp-qwen"])
def test_no_key_is_written_that_the_request_neither_names_nor_gives_a_value_for(llamacpp_backend, qwen_backends,
                                                                                backend_name):
    """Nine optional keys; the request names a rating (with its number), cleaning and a city. Once its values
    are taken, the keys it says nothing about are not written (both models had filled every key)."""
    backend = llamacpp_backend if backend_name.endswith("smollm2") else qwen_backends("llamacpp")
    sig = ("find_cleaners(available_for_pet?, avg_rating?, district_name?, end_date?, has_quality_problem?, "
           "is_cleaning_home?, job_qty?, max_age?, sub_district_name?) — professionals matching criteria")
    value = _decode(backend, CLEANERS, "find good reputation professional cleaning in Bangkok with higher than 4 "
                    "rating", sig=sig)
    assert value.get("avg_rating") == 4, value
    assert not set(value) & {"end_date", "has_quality_problem", "job_qty", "max_age"}, value


def test_bias_off_is_plain_constrained_decoding(llamacpp_backend):
    """Bias 0 adds no processor: the output equals a decode without CopyBias at all."""
    tok = llamacpp_backend.tokenizer
    ids = tok.encode_chat(argument_messages("read_file(path: str)", "Read the file data.csv"))
    outs = []
    for procs in ([], [CopyBias(tok, [Source("request", "Read the file data.csv")], PATH_SCHEMA, 0.0)]):
        s = llamacpp_backend.new_session(1024)
        try:
            outs.append(generate_json(s, ids, PATH_SCHEMA, tok, 64, processors=procs).text)
        finally:
            s.close()
    assert outs[0] == outs[1]


@st.composite
def _case(draw):
    """A schema with bounds, an enum and a length limit, and a request whose numbers and words break them on
    purpose (out of range, too long, not an enum value, a near-miss in case)."""
    lo = draw(st.integers(0, 50))
    hi = draw(st.integers(lo + 1, 100))
    enum = draw(st.lists(st.sampled_from(["red", "green", "blue", "amber", "violet"]), min_size=2, max_size=3,
                         unique=True))
    schema = {"type": "object", "additionalProperties": False, "required": ["n", "color", "code"],
              "properties": {"n": {"type": "integer", "minimum": lo, "maximum": hi},
                             "color": {"type": "string", "enum": enum},
                             "code": {"type": "string", "maxLength": draw(st.integers(2, 5))},
                             "x": {"type": "number", "exclusiveMaximum": 1}}}
    n = draw(st.one_of(st.integers(hi + 1, 999), st.integers(-40, lo - 1) if lo else st.just(-3),
                       st.integers(lo, hi)))
    word = draw(st.sampled_from(["crimson", "teal", enum[0].upper(), enum[-1]]))
    code = draw(st.text("ABCDEFGH", min_size=1, max_size=9))
    x = draw(st.sampled_from([0.5, 3, 17.25]))
    return schema, f"Set n to {n}, the colour to {word}, code {code} and x to {x}"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_case())
def test_copied_values_never_break_the_schema(llamacpp_backend, case):
    """Property: whatever the request offers for copying, even with a strong bias, the output is valid under
    the schema (`_decode` validates it with jsonschema)."""
    schema, request = case
    _decode(llamacpp_backend, schema, request, bias=8.0, sig="configure(n: int, color: str, code: str, x?: num)")


class _Counting:
    """The real session, counting the tokens of the forward passes that score candidate copies."""

    def __init__(self, session):
        self.inner, self.scored = session, 0

    def forward_logits(self, tokens):
        self.scored += len(tokens)
        return self.inner.forward_logits(tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


MATRIX = {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "array", "items": {
    "type": "integer"}}}}, "required": ["rows"]}


@pytest.mark.parametrize("schema, request_text, sig", [
    (MATRIX, "Transpose the matrix [[11, 12, 13], [21, 22, 23], [31, 32, 33]]", "transpose(rows: int[][])"),
    (NUMBERS, "Add 1,250 and 17 after subtracting 3 from 42", "add(a: num, b: num) — add two numbers"),
    ({"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit", "kelvin"]}}, "required": ["unit"]},
     "Show the temperature in kelvin, not celsius", "temperature(unit: enum)"),
    (PATH_SCHEMA, "Read the file notes/plan.md and then summarize it for the weekly report of the whole team",
     "read_file(path: str) — read a file"),
    ({"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
      "required": ["title", "body"]},
     "Create a note titled groceries with the body buy apples at the market on the way home from the office",
     "create_note(title: str, body: str)"),
])
def test_bounded_ranking_picks_what_scoring_every_candidate_picks(llamacpp_backend, schema, request_text, sig):
    """A candidate is scored only while its bound can still beat the best total: a number's or an enum value's
    (its first token's log-probability over its length, plus its priors), a free string's (its joining words and
    anchor). The same arguments as scoring every candidate whole, with fewer tokens scored."""
    tok = llamacpp_backend.tokenizer
    ids = tok.encode_chat(argument_messages(sig, request_text, None))
    out = {}
    for prune in (True, False):
        s = _Counting(llamacpp_backend.new_session(2048))
        try:
            bias = CopyBias(tok, [Source("request", request_text)], schema, session=s)
            bias.prune = prune
            r = generate_json(s, ids, schema, tok, 96, processors=[bias])
        finally:
            s.inner.close()
        out[prune] = (r.text, s.scored, [x["pick"] for x in bias.ranked])
    assert out[True][0] == out[False][0] and out[True][2] == out[False][2]
    assert out[True][1] < out[False][1], out
