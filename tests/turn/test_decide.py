"""The model decides among the candidates (nexus_agent.turn): every outcome on both local backends with the
packaged tool-trained Qwen2.5-Coder-0.5B (its own template's tools section), the call format read from real
templates, and a model without a tools section (SmolLM2) shown compressed signatures."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from logits import kl

from nexus_agent.memory import LiveContext
from nexus_agent.turn.blocks import EPILOGUE_HEAD, ToolBlocks
from nexus_agent.turn.call_format import NEXUS_FORMAT, probe_call_format
from nexus_agent.turn.decide import Candidate, Decider
from nexus_agent.turn.engine import PromptTooLong, decide_turn
from nexus_agent.turn.profile import DecideProfile
from registry.model import Tool

pytestmark = pytest.mark.slow


def _tool(name: str, description: str, props: dict, required: list[str]) -> Tool:
    return Tool.from_mcp({"name": name, "description": description,
                          "inputSchema": {"type": "object", "properties": props, "required": required}})


TOOLS = {t.name: t for t in (
    _tool("get_current_time", "Get the current time in a specific IANA timezone.",
          {"timezone": {"type": "string", "description": "IANA timezone name, e.g. Europe/London"}}, ["timezone"]),
    _tool("add", "Add two numbers and return their sum.",
          {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"]),
    _tool("multiply", "Multiply two numbers.", {"x": {"type": "number"}, "y": {"type": "number"}}, ["x", "y"]),
    _tool("get_weather", "Get the current weather for a city.",
          {"city": {"type": "string", "description": "city name"}}, ["city"]),
)}


def _router_over(tools: dict, path):
    """The gate router over `tools`, its buffer built at `path`."""
    from slb.build import build_buffer
    from slb.embedder import Embedder
    from slb.service import open_router
    from slb.tools import as_entry

    build_buffer(list(tools.values()), Embedder(), path)
    return open_router("gate", tools=[as_entry(t) for t in tools.values()], path=path)


def _public_tools(names) -> dict:
    """The named tools of the public routing data, by name in the order given (skips without the data)."""
    import json
    from pathlib import Path

    data = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "routing" / "tools.jsonl"
    if not data.is_file():
        pytest.skip(f"public routing data not present at {data}")
    rows = {r["name"]: r for r in map(json.loads, data.read_text().splitlines()) if r["name"] in names}
    return {n: Tool.from_mcp(rows[n]) for n in names}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    return _router_over(TOOLS, tmp_path_factory.mktemp("decide") / "b.slb")


def decide(backend, router, text, tool_choice="auto", parallel=False, n_ctx=4096, live=None):
    """One decision on `live` (kept: a later decision reuses the tools prefix it holds, as a server's context
    does) or on a fresh context of `n_ctx` tokens (closed)."""
    own = live is None
    live = live or LiveContext(backend, None, n_ctx)
    try:
        turn = decide_turn(Decider(backend, DecideProfile(mode="model")), router, TOOLS,
                           [{"role": "user", "content": text}], lambda ids: live, n_ctx, None, tool_choice, parallel)
        return turn.decision
    finally:
        if own:
            live.close()


def test_qwen_template_call_format(qwen_backends):
    fmt = probe_call_format(qwen_backends("llamacpp").tokenizer)
    assert (fmt.opener, fmt.between, fmt.closer, fmt.separator) == (
        '<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", "\n")
    assert fmt.template_tools


@pytest.mark.parametrize("name", ["llamacpp", "mlx"])
def test_every_outcome_on_both_backends(qwen_backends, router, name):
    backend = qwen_backends(name)
    live = LiveContext(backend, None, 4096)  # one context for every outcome: the tools prefix stays
    request = functools.partial(decide, backend, router, live=live)
    d = request("Add 12 and 30")  # a tool among the candidates, arguments from the request
    assert d.kind == "call" and d.how == "model" and [c.name for c in d.calls] == ["add"]
    assert d.calls[0].arguments == {"a": 12, "b": 30} and d.p_call > 0.5
    assert sorted(d.candidates) == sorted(TOOLS)  # four tools fit: the model sees them all

    d = request("Thanks, that's all I needed.")  # a text answer
    assert d.kind == "text" and not d.calls and d.p_call < 0.5

    d = request("Thanks, that's all I needed.", tool_choice="required")
    assert d.kind == "call" and d.how == "tool_choice" and d.calls[0].name in TOOLS

    d = request("Add 12 and 30", tool_choice="none")
    assert d.kind == "text" and d.how == "tool_choice" and d.p_call is None

    d = request("Add 12 and 30", tool_choice="multiply")  # a named function
    assert [c.name for c in d.calls] == ["multiply"] and set(d.calls[0].arguments) == {"x", "y"}

    d = request("What is the weather in Paris and what is the weather in London?", parallel=True)
    assert [c.name for c in d.calls] == ["get_weather", "get_weather"]
    assert {c.arguments["city"] for c in d.calls} == {"Paris", "London"}
    live.close()


@pytest.mark.parametrize("request_text", [
    "What is the weather in Paris and what is the weather in London?",
    "What time is it in America/Argentina/Buenos_Aires right now?",
])
def test_after_a_call_the_context_holds_the_tokens_it_names(qwen_backends, router, request_text):
    """After a call the held ids are the tokens the context holds: the arguments as they were decoded, not their
    text encoded again (other tokens for some values: 12 tokens computed again for the time zone, 5 for a city),
    so checking for a further call feeds only the closer; with no value of the request left there is no check."""
    from nexus_agent.trace import Trace

    backend = qwen_backends("llamacpp")
    trace = Trace()
    live = LiveContext(backend, None, 4096, trace=trace)
    decider = Decider(backend, DecideProfile(mode="model"))
    closer = decider.closer
    after_calls = []  # (tokens prefilled, tokens reused) of each prefill that ends a call
    prefill = live.prefill

    def recorded(ids):
        out = prefill(ids)
        if list(ids[-len(closer):]) == closer:
            e = trace.of("memory")[-1]
            after_calls.append((e["prefilled"], e["reused"]))
        return out

    live.prefill = recorded
    try:
        turn = decide_turn(decider, router, TOOLS, [{"role": "user", "content": request_text}], lambda ids: live,
                           4096, None, "auto", True)
        assert turn.decision.kind == "call", turn.decision
        # a further call is checked for while a value of the request is left: after Paris, not after London
        assert len(after_calls) == len(turn.decision.calls) - 1, (after_calls, turn.decision.calls)
        assert all(n <= len(closer) + 2 for n, _ in after_calls), after_calls
        # the context's ids: the prompt, then the calls made, through the last one's arguments (its closer is in
        # the decision's ids; nothing of a further call the decision did not make)
        assert live.ids[: len(turn.ids)] == turn.ids and len(live.ids) <= live.session.n_past
        calls = backend.tokenizer.decode(live.ids[len(turn.ids):])
        assert calls.count("<tool_call>") == len(turn.decision.calls), calls
        fmt, last = decider.fmt, turn.decision.calls[-1]
        whole = fmt.opener + last.name + fmt.between + last.text + fmt.closer  # the last call, as the decision has it
        held = fmt.opener + calls.rsplit(fmt.opener, 1)[1]
        assert whole.startswith(held) and len(whole) - len(held) <= len(fmt.closer) + 2, (held, whole)
    finally:
        live.close()


def test_a_sure_gate_shows_its_pick_alone(qwen_backends, router):
    """k_sure: when the router's gate is sure the model sees its pick alone and still decides call or text and
    fills the arguments; when it is not, the top k."""
    from nexus_agent.turn.decide import top_k

    profile = DecideProfile(mode="model", k=3, k_sure=1, fit_all=0)
    sure = router.route("Add 12 and 30")
    unsure = router.route("Thanks, that's all I needed.")
    assert sure.path == "auto" and unsure.path != "auto", (sure, unsure)
    assert [c.name for c in top_k(sure, TOOLS, profile, len(TOOLS))] == [sure.tool] == ["add"]
    assert len(top_k(unsure, TOOLS, profile, len(TOOLS))) == 3
    assert len(top_k(sure, TOOLS, DecideProfile(mode="model", k=3, fit_all=0), len(TOOLS))) == 3  # k_sure 0: k

    backend = qwen_backends("llamacpp")
    live = LiveContext(backend, None, 4096)
    try:
        d = decide_turn(Decider(backend, profile), router, TOOLS, [{"role": "user", "content": "Add 12 and 30"}],
                        lambda ids: live, 4096, None, "auto", False).decision
        assert d.kind == "call" and d.candidates == ["add"] and d.calls[0].arguments == {"a": 12, "b": 30}
    finally:
        live.close()
    with pytest.raises(ValueError, match="k_sure"):
        DecideProfile(k_sure=-1)


def test_a_prompt_over_the_context_is_refused(qwen_backends, router):
    with pytest.raises(PromptTooLong, match="context holds 300 tokens"):
        decide(qwen_backends("llamacpp"), router, "Add 12 and 30", n_ctx=300)


def test_a_model_without_a_tools_section_sees_signatures(llamacpp_backend, router):
    tok = llamacpp_backend.tokenizer
    assert probe_call_format(tok) == NEXUS_FORMAT
    decider = Decider(llamacpp_backend, DecideProfile(mode="model"))
    ids, spans = decider.prompt([{"role": "user", "content": "Add 12 and 30"}], _candidates())
    assert spans == []
    text = tok.decode(ids)
    assert "add(a: num, b: num)" in text and '<tool_call>\n{"name": "NAME"' in text
    d = decide(llamacpp_backend, router, "Add 12 and 30", tool_choice="add")
    assert d.calls[0].name == "add" and d.calls[0].arguments == {"a": 12, "b": 30}


def _candidates():
    from nexus_agent.turn.decide import Candidate

    return [Candidate(t, 0.5, i) for i, t in enumerate(TOOLS.values())]


SQL_TOOLS = {**TOOLS, **{t.name: t for t in (
    _tool("create_table", "Create a new table in the SQLite database.",
          {"query": {"type": "string", "description": "the CREATE TABLE statement"}}, ["query"]),
    _tool("list_tables", "List the tables of the SQLite database.", {}, []),
)}}


@pytest.fixture(scope="module")
def sql_router(tmp_path_factory):
    return _router_over(SQL_TOOLS, tmp_path_factory.mktemp("decide_sql") / "b.slb")


def _after_call(request: str, name: str, arguments: str, result: str) -> list[dict]:
    return [{"role": "user", "content": request},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": result}]


def test_a_tool_the_turn_called_is_called_again_only_on_a_new_part(qwen_backends, router, sql_router):
    """Shown a result, the 0.5B calls the same tool again with p_call 0.99: the same sum, or a create_table
    whose query is the first call's "Table created successfully" (held-out probe on the sqlite server). A
    further call of a tool the turn called must take a part of the request its calls did not."""
    from nexus_agent.turn.engine import calls_made

    add = _after_call("Add 12 and 30", "add", '{"b": 30, "a": 12, "note": null}', "42")
    assert [(c.name, c.arguments) for c in calls_made(add)] == [("add", {"b": 30, "a": 12, "note": None})]
    assert calls_made(add + [{"role": "user", "content": "Now multiply them"}]) == []
    create = _after_call("Create a table named products with columns id integer and title text.", "create_table",
                         '{"query": "CREATE TABLE products (id INTEGER, title TEXT)"}', "Table created successfully")
    backend = qwen_backends("llamacpp")
    live = LiveContext(backend, None, 4096)
    repeated = []
    try:
        for messages, tools, r in ((add, TOOLS, router), (create, SQL_TOOLS, sql_router)):
            for parallel in (False, True):
                d = decide_turn(Decider(backend, DecideProfile(mode="model")), r, tools, messages,
                                lambda ids: live, 4096, None, "auto", parallel).decision
                called = messages[1]["tool_calls"][0]["function"]["name"]
                assert d.kind == "text" or all(c.name != called for c in d.calls), (d.calls, d.p_call)
                assert d.repeated in (None, called) and (d.repeated is None or d.kind == "text"), d
                repeated += [d.as_dict()["repeated"]] if d.repeated else []
    finally:
        live.close()
    assert "create_table" in repeated, repeated  # the trace says why a call the model chose became text


def test_a_parallel_call_must_act_on_its_own_part_of_the_request():
    from nexus_agent.turn.decide import Choice
    from nexus_agent.turn.request_parts import new_part

    weather = "What is the weather in Paris and in London, in celsius?"
    paris = [Choice("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert new_part({"city": "London", "unit": "celsius"}, paris, weather)  # one word its own, one shared
    assert not new_part({"city": "Paris", "unit": "celsius"}, paris, weather)
    tokyo = [Choice("get_current_time", {"timezone": "Asia/Tokyo"})]
    assert not new_part({"timezone": "Tokyo"}, tokyo, "What time is it in Tokyo (Asia/Tokyo)?")
    repo = "/tmp/work/repo"
    asked = f"Show the last 3 commits of the repository at {repo}"
    log = [Choice("git_log", {"repo_path": repo, "max_count": 3})]
    # "last" and "commits" are new, but the path and the count are git_log's: a step after it, not beside it
    assert not new_part({"repo_path": repo, "revision": "last 3 commits"}, log, asked)


def test_a_further_call_is_tried_only_while_a_value_of_the_request_is_left():
    from nexus_agent.turn.decide import Choice
    from nexus_agent.turn.request_parts import _value_words, values_left

    assert _value_words("Find the average closing price of Apple stock in the past 60 days") == {"apple", "60"}
    assert _value_words("Search for a hotel in Toronto, Canada? I would like one room.") == {"toronto", "canada"}
    assert _value_words("email bob@example.org the file 'Q3 plan' from /tmp/a") == {
        "bob", "example", "org", "q3", "plan", "tmp", "a"}
    apple = [Choice("avg_closing_price", {"company": "Apple", "days": 60, "data_source": "yahoo finance"})]
    assert not values_left("Find the average closing price of Apple stock in the past 60 days", apple)
    weather = "What is the weather in Paris and in London?"
    assert values_left(weather, [Choice("get_weather", {"city": "Paris"})])
    assert not values_left(weather, [Choice("get_weather", {"city": "Paris"}), Choice("get_weather",
                                                                                       {"city": "London"})])
    uber = "Tôi cần một chuyến xe Uber loại 'Plus' từ '2150 Shattuck Ave, Berkeley, CA', chờ tối đa 10 phút."
    ride = {"loc": "2150 Shattuck Ave, Berkeley, CA", "time": 10, "type": "plus"}
    assert not values_left(uber, [Choice("uber.ride", ride)])  # "Uber" names the tool called, no value left
    assert values_left(uber, [Choice("taxi.ride", ride)])


def test_a_request_counts_the_values_it_names_up_to_a_cap():
    """VALUES_CAP 1: whether the request names a value at all."""
    from nexus_agent.turn.request_parts import VALUES_CAP, request_values

    assert request_values("Bonjour, comment ça va ?") == 0 and request_values("Tell me a joke.") == 0
    assert request_values("What time is it in Tokyo?") == 1 == VALUES_CAP
    assert request_values("Fly from Paris to Rome on 2024-05-01 for 2 adults") == VALUES_CAP
    assert request_values("Search arXiv for recent papers on speculative decoding.") == 1  # a mixed-case name
    assert request_values("OK, thanks!") == 0 and request_values("¿Tienes nombre?") == 0
    from nexus_agent.turn.profile import DecideProfile

    p = DecideProfile(bias=-1.0, w_model=0.0, w_values=0.6)
    assert p.call_score(0.5, 0.3, 0.1, 0) < 0 < p.call_score(0.5, 0.3, 0.1, 2)
    assert DecideProfile().call_score(0.9, 0.3, 0.1, 3) == DecideProfile().call_score(0.9, 0.3, 0.1)


@pytest.mark.parametrize("name", ["llamacpp"])
def test_a_call_that_takes_every_value_is_the_only_one_decoded(qwen_backends, router, name):
    backend = qwen_backends(name)
    live = LiveContext(backend, None, 4096)
    begun: list[int] = []

    def on_arguments(index, tool, shown):
        begun.append(index)
        return lambda piece: False

    try:
        turn = decide_turn(Decider(backend, DecideProfile(mode="model")), router, TOOLS,
                           [{"role": "user", "content": "Add 12 and 30"}], lambda ids: live, 4096, None, "auto",
                           True, on_arguments=on_arguments)
    finally:
        live.close()
    assert [(c.name, c.arguments) for c in turn.decision.calls] == [("add", {"a": 12, "b": 30})]
    assert begun == [0]  # no further call was opened and decoded only to be dropped


def test_a_stray_control_token_is_no_reply(qwen_backends):
    decider = Decider(qwen_backends("llamacpp"), DecideProfile(mode="model"))
    tok = decider.tok
    im_start, im_end = tok.encode("<|im_start|>", special=True)[0], tok.encode("<|im_end|>", special=True)[0]
    assert im_start in decider.stray and im_end not in decider.stray and decider.opener[0] not in decider.stray
    logits = np.full(tok.vocab_size, -30.0, dtype=np.float32)
    logits[im_start], logits[decider.opener[0]], logits[im_end] = 10.0, 9.0, 8.0
    p = decider.p_call(logits)  # <|im_start|> is not a reply: p(call | a reply) is the opener's share of the rest
    assert abs(p - np.exp(9.0) / (np.exp(9.0) + np.exp(8.0))) < 1e-3
    mask = decider.text_mask()
    later = mask(tok.encode("The answer is"), logits)
    assert later[im_start] == -np.inf and later[im_end] == 8.0  # forbidden anywhere in a text answer; the end is not


def test_an_answer_after_tool_results_gets_the_request_and_its_results_in_one_turn():
    from nexus_agent.prompts import ANSWER_SYSTEM, results_answer_messages

    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Add 2 and 3"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    out = results_answer_messages(messages)
    assert out == [{"role": "system", "content": f"Be brief.\n\n{ANSWER_SYSTEM}"},
                   {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                   {"role": "user", "content": "Add 2 and 3\n\nTool add returned: 5"}]


def test_names_scored_while_they_can_win_pick_what_scoring_every_name_picks(qwen_backends):
    """A name's log-probability is at most its first token's: names are scored best bound first and skipped once
    none can win, so the choice is the one scoring every name makes, for any offsets the profile adds."""
    backend = qwen_backends("llamacpp")
    decider = Decider(backend, DecideProfile(mode="model"))
    cands = [Candidate(t, 0.0, i) for i, t in enumerate(TOOLS.values())]
    names = [c.name for c in cands]
    rng = np.random.default_rng(0)
    live = LiveContext(backend, None, 4096)
    skipped = 0
    try:
        for text in ("Add 12 and 30", "What's the weather like in Paris?", "Multiply 3 by 4", "What time is it?"):
            ids = decider.prompt([{"role": "user", "content": text}], cands)[0] + decider.opener
            logits = live.prefill(ids)
            every = decider.name_logprobs(live, ids, logits, names)
            for offsets in [dict.fromkeys(names, 0.0)] + [dict(zip(names, rng.normal(0, 3, len(names))))
                                                          for _ in range(4)]:
                some = decider.name_logprobs(live, ids, logits, names, offsets)
                assert live.session.n_past == len(ids)  # the scored names are removed again
                best = max(names, key=lambda n: every[n] + offsets[n])
                assert max(some, key=lambda n: some[n] + offsets[n]) == best, (text, every, some, offsets)
                assert all(abs(some[n] - every[n]) < 1e-3 for n in some)  # the same passes, same context
                skipped += len(names) - len(some)
    finally:
        live.close()
    assert skipped > 0


def test_the_text_after_the_tools_is_one_block_under_every_tool_list(qwen_backends):
    """Qwen2.5's template closes its tools section with `</tools>`, its call-format instructions and the user
    turn's opener: the same ~45 tokens whatever the tools. The prompt gives them a span of their own, so they are
    compiled once and spliced (their first EPILOGUE_HEAD tokens decoded again) after any candidates, and the
    decision's logits stay those of text prefill."""
    b = qwen_backends("llamacpp")
    decider = Decider(b, DecideProfile(mode="model"))
    msgs = [{"role": "user", "content": "Multiply 6 by 7, please."}]
    tools = list(TOOLS.values())
    (ids1, s1), (ids2, s2) = (decider.prompt(msgs, [Candidate(t, 0.5, i) for i, t in enumerate(part)])
                              for part in (tools[:2], tools[2:]))
    assert len(s1) == len(s2) == 3 and s1[-1][0] == s1[-2][1] and s2[-1][0] == s2[-2][1]
    after = ids1[s1[-1][0]:s1[-1][1]]
    assert after == ids2[s2[-1][0]:s2[-1][1]] and len(after) > 30
    text = b.tokenizer.decode(after)
    assert text.startswith("\n</tools>") and text.endswith("<|im_start|>user\n")
    assert b.tokenizer.decode(ids1[s1[-1][1]:]).startswith(msgs[0]["content"])
    blocks = ToolBlocks(b)
    live, fresh, plain = (LiveContext(b, None, 2048) for _ in range(3))
    try:
        blocks.prefill(live, ids1, s1, epilogue=True)  # the first prompt compiles its tools and the epilogue
        got, st = blocks.prefill(fresh, ids2, s2, epilogue=True)
        assert (st.compiled, st.spliced) == (2, 1) and st.text_tokens == len(ids2) - len(after) + EPILOGUE_HEAD
        want = plain.prefill(ids2)
        assert fresh.session.n_past == len(ids2)
        # measured here: KL 0.002 nats, p(call) 0.002 apart (no repair: 0.003, 0.004)
        assert kl(want[None], got[None]).max() < 0.05 and int(np.argmax(got)) == int(np.argmax(want))
        assert abs(decider.p_call(got) - decider.p_call(want)) < 0.05
    finally:
        for c in (live, fresh, plain):
            c.close()


def test_after_a_text_answer_a_request_is_still_read_for_a_call(qwen_backends, router):
    """With an assistant's text answer in its history the 0.5B puts p(call) ~0 on every later request; p(call) is
    also read on the conversation without that prose (the backend's scratch sequence, from the shared prefix), so
    "What time is it in Paris now?" is a call; chatter after a joke stays text."""
    from nexus_agent.turn.engine import last_exchange, readings, without_prose

    tokyo = [{"role": "user", "content": "What time is it in Tokyo (Asia/Tokyo)?"},
             {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                 "name": "get_current_time", "arguments": '{"timezone": "Asia/Tokyo"}'}}]},
             {"role": "tool", "tool_call_id": "c1", "content": '{"datetime": "2026-12-06T16:00:00+09:00"}'},
             {"role": "assistant", "content": "It is 16:00 in Tokyo."}]
    paris = tokyo + [{"role": "user", "content": "What time is it in Paris (Europe/Paris) now?"}]
    exchange = tokyo[:3] + paris[-1:]
    assert without_prose(paris) == exchange and without_prose(exchange) is exchange
    assert readings(paris) == [paris[-1:], exchange] and last_exchange(paris[-1:]) == paris[-1:]
    joke = [{"role": "user", "content": "Tell me a joke about programmers."},
            {"role": "assistant", "content": "Why do programmers prefer dark mode? Because light attracts bugs."},
            {"role": "user", "content": "Haha, thanks!"}]
    backend = qwen_backends("llamacpp")
    live = LiveContext(backend, None, 4096)
    try:
        decider = Decider(backend, DecideProfile(mode="model"))
        d = decide_turn(decider, router, TOOLS, paris, lambda ids: live, 4096).decision
        assert d.kind == "call" and d.calls[0].name == "get_current_time" and d.p_call > 0.5 and d.reading >= 1, d
        from nexus_agent.openai_api import template_messages

        full = decider.p_call(LiveContext(backend, None, 4096).prefill(  # the conversation as it is: ~0
            decider.prompt(template_messages(paris), [Candidate(t, 0.0, i) for i, t in enumerate(TOOLS.values())])[0]))
        assert full < 0.1, full
        assert decide_turn(decider, router, TOOLS, joke, lambda ids: live, 4096).decision.kind == "text"
    finally:
        live.close()


def test_after_calls_a_request_is_also_read_alone(qwen_backends, router):
    """Three calls and their results into a conversation, the 0.5B reads p(call) 0.12 for a request it reads at
    0.82 alone (measured here; `nexus eval serve`'s conversation lost its fifth request to an empty text answer
    so): p(call) is also read on the last exchange alone, and the request is a call."""
    from evals.decide_measure import called_turns
    from nexus_agent.openai_api import template_messages
    from nexus_agent.turn.engine import readings

    def done(k, name, args):
        return called_turns(k, name, args, {"status": "ok", "result": f"done (step {k})"})

    history = ([{"role": "system", "content": "You are a helpful assistant. Call a function when one fits."},
                {"role": "user", "content": "Add 2 and 3."}] + done(1, "add", {"a": 2, "b": 3})
               + [{"role": "user", "content": "Multiply 4 by 5."}] + done(2, "multiply", {"x": 4, "y": 5})
               + [{"role": "user", "content": "What's the weather in Oslo?"}]
               + done(3, "get_weather", {"city": "Oslo"}))
    messages = history + [{"role": "user", "content": "Quelle heure est-il à 'Europe/Paris' ?"}]
    assert readings(messages) == [messages[:1] + messages[-1:]]
    backend = qwen_backends("llamacpp")
    decider = Decider(backend, DecideProfile(mode="model"))
    live, whole = LiveContext(backend, None, 4096), LiveContext(backend, None, 4096)
    try:
        cands = [Candidate(t, 0.0, i) for i, t in enumerate(TOOLS.values())]
        full = decider.p_call(whole.prefill(decider.prompt(template_messages(messages), cands)[0]))
        assert full < 0.4, full
        d = decide_turn(decider, router, TOOLS, messages, lambda ids: live, 4096).decision
        assert d.kind == "call" and d.reading == 1 and d.p_call > 0.6, d
        assert d.calls[0].name == "get_current_time" and d.calls[0].arguments == {"timezone": "Europe/Paris"}, d
    finally:
        live.close()
        whole.close()


def test_a_call_the_rule_turns_down_is_answered_without_the_tools(qwen_backends, router):
    """Where the model would call (p_call >= 0.5) and the rule decides text, the answer's prompt has no tools
    section: under it the 0.5B wrote its call out as the answer (a fenced `name: uber.ride` for "Bonjour !")."""
    from native.generate import stream_generate

    backend = qwen_backends("llamacpp")
    decider = Decider(backend, DecideProfile(mode="model", bias=-30.0))  # text, whatever the model reads
    live = LiveContext(backend, None, 4096)
    try:
        turn = decide_turn(decider, router, TOOLS, [{"role": "user", "content": "What's the weather in Oslo?"}],
                           lambda ids: live, 4096)
        assert turn.decision.kind == "text" and turn.decision.p_call > 0.5, turn.decision
        prompt = backend.tokenizer.decode(turn.ids)
        assert "<tools>" not in prompt and prompt.rstrip().endswith("assistant"), prompt
        text = "".join(r.text for r in stream_generate(backend, turn.ids, 24, session=turn.live.session,
                                                       logits_processors=[decider.text_mask()], logits=turn.logits))
        assert text.strip() and "get_weather" not in text and "{" not in text, text
    finally:
        live.close()


def test_a_matrix_the_request_writes_is_copied_whole_in_place(qwen_backends, tmp_path):
    """In place after the tools prompt (the ten tools of `nexus eval serve`'s conversation, from the public data),
    the 0.5B closed each matrix after its first row: a closing token that spells more brackets than the request
    writes there ("]]" after the "3" of "3], [4") was among those a copied number may close with ({"matA": [[1, 2,
    3]], "matB": [[10, 11, 12]]}, and three more calls so). The closers the request writes decide."""
    from nexus_agent.turn.profile import load_decide_profile

    tools = _public_tools(["uber.ride", "stars_list", "card_game_probability.calculate", "send_message",
                           "physics.calculate_cone_mass", "Hotels_4_SearchHotel", "mat_mul", "avg_closing_price",
                           "geometry.area_circle", "getDataForProfessional"])
    router = _router_over(tools, tmp_path / "m.slb")
    backend = qwen_backends("llamacpp")
    profile = load_decide_profile(backend.info.fingerprint, True)
    live = LiveContext(backend, None, 8192)
    request = ("I'm working on a project that involves some heavy matrix calculations, and I need to multiply "
               "several pairs of matrices to analyze the data. Could you multiply these sets of matrices: [[1, 2, "
               "3], [4, 5, 6], [7, 8, 9]] with [[10, 11, 12], [13, 14, 15], [16, 17, 18]]; [[19, 20], [21, 22]] "
               "with [[23, 24], [25, 26]]; [[27, 28, 29, 30], [31, 32, 33, 34]] with [[35, 36, 37, 38], [39, 40, "
               "41, 42]]; and [[43, 44], [45, 46]] with [[47, 48], [49, 50]]?")
    try:
        d = decide_turn(Decider(backend, profile), router, tools, [
            {"role": "system", "content": "You are a helpful assistant. Call a function when one fits the request."},
            {"role": "user", "content": request}], lambda ids: live, 8192, parallel=True).decision
    finally:
        live.close()
    assert d.kind == "call" and d.calls[0].name == "mat_mul", d
    assert d.calls[0].arguments == {"matA": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
                                    "matB": [[10, 11, 12], [13, 14, 15], [16, 17, 18]]}, d.calls
    fed, kept = d.drafts[0]  # the first call's copied matrices were drafted: the trace's decide event says how much
    assert 0 < kept <= fed and d.as_dict()["drafts"][0] == [fed, kept], d.drafts
    e = d.as_dict()  # the trace's decide event carries the router's evidence: its score is recomputed from it
    assert len(e["scores"]) == len(e["candidates"]) == len(d.candidates) > 0, e
    score = profile.call_score(d.p_call, e["top1"], e["margin"], e["values"], e["hidden_term"])
    assert abs(score - e["score"]) < 0.01, e  # the hidden-state rule's term is in the event too


def test_respelled_keeps_the_tokens_the_context_holds_for_the_same_text(qwen_backends):
    from nexus_agent.arguments.constrained import token_bytes
    from nexus_agent.turn.engine import respelled

    tok = qwen_backends("llamacpp").tokenizer
    tb = token_bytes(tok)
    head = tok.encode("Call: ")
    pieces = ['{"', "city", '":"', "Par", "is", '"}']  # as a grammar decodes them, not as the text encodes
    held = head + [t for p in pieces for t in tok.encode(p)]
    ids = head + tok.encode('{"city":"Paris"} and then Lyon')
    assert ids[: len(held)] != held  # the same text, other tokens
    out = respelled(held, ids, tb)
    assert out[: len(held)] == held and tok.decode(out) == tok.decode(ids)
    other = head + tok.encode('{"city":"Pau"} and then Lyon')  # other text: kept from where it differs
    out = respelled(held, other, tb)
    assert tok.decode(out) == tok.decode(other) and out[: len(head)] == head
    assert respelled(held, ids, tb, start=len(ids)) == ids  # nothing before `start` is touched


def test_the_next_request_reuses_the_call_it_sends_back(qwen_backends, router):
    """A client sends the call back as it got it (the arguments' text) with its result: the template shows that
    text (`JsonText`), and the context's own tokens for it are kept (`respelled`), so the next decision prefills
    from the result on."""
    from nexus_agent.trace import Trace

    backend = qwen_backends("llamacpp")
    trace = Trace()
    live = LiveContext(backend, None, 4096, trace=trace)
    decider = Decider(backend, DecideProfile(mode="model"))
    try:
        messages = [{"role": "user", "content": "What time is it in Europe/Paris?"}]
        turn = decide_turn(decider, router, TOOLS, messages, lambda ids: live, 4096)
        assert turn.decision.kind == "call", turn.decision
        call = turn.decision.calls[0]
        held = len(live.ids)
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": call.name, "arguments": call.text}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": '{"datetime": "2026-12-06T14:02:00+01:00"}'},
                     {"role": "user", "content": "And in Asia/Tokyo?"}]
        n = len(trace.of("memory"))
        decide_turn(decider, router, TOOLS, messages, lambda ids: live, 4096)
        first = trace.of("memory")[n]
        assert first["reused"] >= held - 2, (first, held)  # all but the call's closer tokens
    finally:
        live.close()


def test_a_call_sent_back_is_shown_as_its_text(qwen_backends):
    from nexus_agent.openai_api import template_messages

    tok = qwen_backends("llamacpp").tokenizer
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":[2,3]}'}}
    msgs = template_messages([{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": None, "tool_calls": [call]}])
    text = tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert '"arguments": {"a":1,"b":[2,3]}' in text, text
    call["function"]["arguments"] = {"a": 1, "b": [2, 3]}  # an object, not text: the template's own JSON
    text = tok.apply_chat_template(template_messages([{"role": "assistant", "content": None, "tool_calls": [call]}]),
                                   add_generation_prompt=False)
    assert '"arguments": {"a": 1, "b": [2, 3]}' in text, text


@pytest.mark.parametrize("name", ["llamacpp", "mlx"])
def test_the_models_near_certain_no_is_a_text_answer(qwen_backends, router, name):
    """A rule that would call on the router's evidence alone (bias +5) calls for "Thanks, that's all I needed.";
    with `p_veto` above the model's p(call) the answer is text. After a prose answer the request is also read
    without it, where the backend can (`Session.probe`, llama.cpp): MLX cannot, so the model's "no" is not known to
    hold on every reading and does not overrule the rule there."""
    from dataclasses import replace

    backend = qwen_backends(name)
    live = LiveContext(backend, None, 4096)

    def run(profile, messages):
        return decide_turn(Decider(backend, profile), router, TOOLS, messages, lambda ids: live, 4096).decision

    try:
        thanks = [{"role": "user", "content": "Thanks, that's all I needed."}]
        rule = DecideProfile(mode="model", bias=5.0, w_model=0.0)
        d = run(rule, thanks)
        assert d.kind == "call" and not d.vetoed and d.p_call < 0.5
        d = run(replace(rule, p_veto=0.5), thanks)
        assert d.kind == "text" and d.vetoed and d.how == "model" and not d.calls and d.as_dict()["vetoed"]
        after_prose = [{"role": "user", "content": "What time is it in Tokyo (Asia/Tokyo)?"},
                       {"role": "assistant", "content": "It is 10:04 in Tokyo."},
                       {"role": "user", "content": "Thanks, that's all I needed."}]
        d = run(replace(rule, p_veto=0.5), after_prose)
        if name == "mlx":
            assert not d.vetoed and d.kind == "call"
        else:
            assert d.vetoed == (d.p_call < 0.5) and d.kind == ("text" if d.vetoed else "call")
    finally:
        live.close()


def test_a_spliced_decision_within_the_splice_reach_is_made_again_on_the_prompt_as_text(qwen_backends, router):
    """Blocks compiled right after the tools preamble and spliced deeper read p(call) and the names close to text
    prefill, not exactly (README, *Deciding*). Where the spliced reading is within the profile's measured reach of
    another outcome the decider decides again on the prompt prefilled as text, and makes text prefill's decision;
    with no reach it keeps the spliced reading."""
    from nexus_agent.turn.engine import decision_prompt

    b = qwen_backends("llamacpp")
    cands = [Candidate(t, 0.0, i) for i, t in enumerate(TOOLS.values())]

    def run(text: str, blocks: ToolBlocks | None, **reach):
        decider = Decider(b, DecideProfile(mode="model", **reach), blocks=blocks)
        msgs = [{"role": "user", "content": text}]
        if blocks is not None:  # each candidate's block computed where `nexus compile` puts it, after the head
            ids, spans = decision_prompt(decider, msgs, cands)
            blocks.compile(ids[:spans[0][0]], [ids[a:c] for a, c in spans])
        live = LiveContext(b, None, 4096)
        try:
            d = decide_turn(decider, router, TOOLS, msgs, lambda ids: live, 4096).decision
            return d, list(live.ids)
        finally:
            live.close()

    blocks = ToolBlocks(b)
    for text in ("Add 12 and 30", "Thanks, that's all I needed."):
        want, _ = run(text, None)
        kept, _ = run(text, blocks)
        assert kept.spliced == len(TOOLS) + 1 and kept.rechecked == []
        again, held = run(text, blocks, splice_err=50.0)  # every reading is within reach: rechecked
        assert again.rechecked[:1] == ["call"], again
        assert (again.kind, [c.name for c in again.calls]) == (want.kind, [c.name for c in want.calls])
        assert abs(again.p_call - want.p_call) < 0.01 and again.prefill_ms > 0
        if want.kind == "call":
            assert again.calls[0].arguments == want.calls[0].arguments
        named, _ = run(text, blocks, splice_name_err=50.0)  # a call's name within reach: rechecked alone
        assert named.rechecked == (["name"] if named.kind == "call" else []), named
        assert [c.name for c in named.calls] == [c.name for c in want.calls] or want.kind == "text"



def _restates(value, sub: dict) -> bool:
    """Whether `value` writes its schema `sub` out: an object holding one of its keywords with the schema's own
    value, or a JSON type name as a string."""
    from nexus_agent.arguments.schema_echo import KEYWORDS, TYPE_NAMES

    if isinstance(value, dict):
        return any(k in KEYWORDS and sub.get(k) == v for k, v in value.items()) or any(
            isinstance(v, dict) and _restates(v, sub) for v in value.values())
    return isinstance(value, str) and value in TYPE_NAMES


ECHOES = {  # public BFCL tools and requests the 0.5B answered with its schema (stop 58's argument provenance)
    "DB2Tablespace.resolveTablespaceReference": "Help me resolve a tablespace reference named 'USERSPACE1' in a DB2 "
    "database using a data source object `db2DataSource` and a progress monitor `dbMonitor`?",
    "MacBaseInstallerBundler.validateAppImageAndBundeler": "Help me ensure that the application image directory "
    "exists and has a valid name when preparing parameters for creating a macOS installer package, given that the "
    "application image path is '/Applications/MyApp.app' and the application name is 'MyApp'?",
    "get_personality_traits": "Get me strength and weakness traits for ENFJ personality type.",
}


@pytest.mark.parametrize("tool", list(ECHOES))
def test_no_value_restates_its_schema(qwen_backends, tool, tmp_path):
    """Shown the schemas in its template's tools section, the 0.5B wrote them as the values: `"dataSource":
    {"description": "DB2DataSource object ..."}` for a parameter of no type, `"params": {"params": {"description":
    ..., "type": "object"}}` for an object without properties, `"type": "array"` for the personality type. The
    grammar allows all three; `schema_echo.SchemaEcho` refuses the token that starts one, and the model writes a
    value."""
    tools = _public_tools(list(ECHOES))
    router = _router_over(tools, tmp_path / "e.slb")
    backend = qwen_backends("llamacpp")
    live = LiveContext(backend, None, 4096)
    try:
        d = decide_turn(Decider(backend, DecideProfile(mode="model")), router, tools,
                        [{"role": "user", "content": ECHOES[tool]}], lambda ids: live, 4096, None, tool).decision
    finally:
        live.close()
    assert d.kind == "call" and d.calls[0].name == tool, d
    args, props = d.calls[0].arguments, tools[tool].input_schema["properties"]
    assert not any(_restates(v, props[k]) for k, v in args.items()), args
    if tool.startswith("DB2"):  # a parameter of no type: the values the request writes, as strings
        assert args == {"dataSource": "db2DataSource", "monitor": "dbMonitor", "reference": "USERSPACE1"}, args


@pytest.mark.parametrize("name", ["llamacpp", "mlx"])
def test_the_hidden_state_rule_decides_where_the_state_is_read(qwen_backends, router, name):
    """A profile with a hidden-state rule (`DecideProfile.reading`) reads the model's final state at the prompt's end
    and decides by that rule: bias -50 answers "Add 12 and 30" in text where the profile's own rule calls, +50 calls
    for "Thanks, that's all I needed."; a profile without one reads no state."""
    backend = qwen_backends(name)
    live = LiveContext(backend, None, 4096)
    rng = np.random.default_rng(0)
    w = list(rng.normal(size=backend.info.d_model))
    reading = {"bias": -50.0, "w_model": 0.0, "w_top1": 0.0, "w_margin": 0.0, "w_values": 0.0, "w_hidden": w,
               "splice_err": 0.0}

    def run(profile, text):
        return decide_turn(Decider(backend, profile), router, TOOLS, [{"role": "user", "content": text}],
                           lambda ids: live, 4096).decision

    try:
        own = DecideProfile(mode="model", bias=5.0, w_model=0.0)
        d = run(own, "Add 12 and 30")
        assert d.kind == "call" and d.hidden is None and d.hidden_term is None
        d = run(DecideProfile(mode="model", bias=5.0, w_model=0.0, reading=reading), "Add 12 and 30")
        assert d.kind == "text" and d.hidden.shape == (backend.info.d_model,)
        assert d.hidden_term == pytest.approx(float(np.dot(d.hidden, w) / np.linalg.norm(d.hidden)))
        assert d.as_dict()["hidden_term"] == round(d.hidden_term, 3) and d.score < 0
        thanks = "Thanks, that's all I needed."
        d = run(DecideProfile(mode="model", bias=-5.0, reading=dict(reading, bias=50.0)), thanks)
        assert d.kind == "call" and d.p_call < 0.5
    finally:
        live.close()


def test_last_hidden_is_the_state_both_backends_read_and_the_context_goes_on_as_before(qwen_backends):
    """`last_hidden` feeds the last position again with the final state as output: llama.cpp's and MLX's states of
    the same prompt point the same way, MLX's logits from its state are the prompt's logits, and a context that read
    it goes on as one that did not."""
    import mlx.core as mx

    lc, mlx = qwen_backends("llamacpp"), qwen_backends("mlx")
    ids = lc.tokenizer.encode("<|im_start|>user\nAdd 12 and 30<|im_end|>\n<|im_start|>assistant\n", special=True)
    states, logits = {}, {}
    for name, backend in (("llamacpp", lc), ("mlx", mlx)):
        with backend.new_session(512) as s:
            logits[name] = s.prefill(ids)
            states[name] = s.last_hidden()
            assert s.n_past == len(ids)
            after = s.decode(int(np.argmax(logits[name])))
        with backend.new_session(512) as ref:
            ref.prefill(ids)
            assert kl(ref.decode(int(np.argmax(logits[name]))), after) < 1e-3, name
    a, b = states["llamacpp"], states["mlx"]
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.99
    again = np.array(mlx.model.logits(mx.array(b)[None, None])[0, 0].astype(mx.float32))
    assert np.abs(again - logits["mlx"]).max() < 1e-2 * np.abs(logits["mlx"]).max()
