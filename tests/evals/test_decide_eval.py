"""`nexus eval decide`: a real tiny run through the CLI (JSON shape, table, plot, dump), and the calibration's
fit on measurements whose answer is known."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from evals.decide_fit import apply, fit
from evals.decide_measure import HISTORIES, items
from nexus_agent.turn.profile import DecideProfile


def test_tiny_run_writes_the_json_the_issue_names(routing_data, tmp_path, capsys):
    from nexus_agent.cli import main

    out, dump = tmp_path / "decide.json", tmp_path / "dump.json"
    assert main(["eval", "decide", "--tools", str(routing_data / "tools.jsonl"), "--queries",
                 str(routing_data / "queries.jsonl"), "--irrelevant", str(routing_data / "queries_irrelevant.jsonl"),
                 "--sizes", "10", "--model", "smollm2", "--ks", "3", "--k-sure", "1", "--relevant", "2",
                 "--n-irrelevant", "1", "--n-chat", "2", "--timed", "1", "--n-ctx", "4096", "--dump", str(dump),
                 "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["items"] == {"relevant": 2, "irrelevant": 1, "chat": 2}
    variants = r["sizes"]["10"]["smollm2"]
    assert {"router", "top3", "nexus"} <= set(variants)
    for v in ("router", "top3", "nexus"):
        m = variants[v]
        for key in ("decision_acc", "tool_acc", "irrelevant_no_call", "chat_no_call", "relevant_no_call",
                    "recall_at_k", "decide_ms_p50", "prompt_tokens_p50"):
            assert key in m
        assert 0.0 <= m["decision_acc"] <= 1.0 and m["n"] == 5
    assert variants["nexus"]["source"] == "router"  # SmolLM2's template has no tools section: the router decides
    assert variants["nexus"]["call_ms_p50"] > 0 and variants["top3"]["prompt_tokens_p50"] > 0
    assert r["profiles"]["smollm2"]["mode"] == "router"
    measured = json.loads(dump.read_text())["smollm2"]["10"]["top3"]
    assert len(measured) == 5 and all(0.0 <= m["p_call"] <= 1.0 for _, m in measured)
    from nexus_agent.turn.request_parts import request_values

    assert all(m["values"] == request_values(it["messages"][-1]["content"]) for it, m in measured)
    sure = json.loads(dump.read_text())["smollm2"]["10"]["top3-sure1"]  # the gate sure: the router's pick alone
    assert len(sure) == 5 and all(s == m or (len(s["cands"]) == 1 and s["cands"] == m["cands"][:1])
                                  for (_, s), (_, m) in zip(sure, measured))
    assert any(len(s["cands"]) == 1 for _, s in sure) and "top3-sure1" in variants
    assert (tmp_path / "decide.png").read_bytes()[:4] == b"\x89PNG"
    assert "| tools | model | variant |" in capsys.readouterr().out


def test_the_router_row_is_the_router_mode_of_the_shipped_setting_after_every_model_pass(routing_data, tmp_path,
                                                                                          nexus_home):
    """The `router` row is planned with the model's own setting in router mode (its floor for requests naming no
    value), not with the neutral setting the previous item's model pass left on the engine (stop 61: SmolLM2's
    router row at 1,000 tools kept 1 of 12 chat turns from a call where the router alone, run by itself, kept 5)."""
    from nexus_agent.cli import main
    from nexus_agent.turn.profile import save_decide_profile
    from nexus_agent.turn.request_parts import request_values

    class A:  # seed 59's two relevant requests name no value ("I need a therapist for my family in berkeley.")
        queries, irrelevant = str(routing_data / "queries.jsonl"), str(routing_data / "queries_irrelevant.jsonl")
        chat, relevant, n_irrelevant, n_chat, seed = None, 2, 0, 0, 59

    names = [json.loads(line)["name"] for line in (routing_data / "tools.jsonl").read_text().splitlines()]
    assert [request_values(i["messages"][-1]["content"]) for i in items(A, names)] == [0, 0]
    data = ["--tools", str(routing_data / "tools.jsonl"), "--queries", A.queries, "--irrelevant", A.irrelevant,
            "--sizes", "10", "--model", "smollm2", "--relevant", "2", "--n-irrelevant", "0", "--n-chat", "0",
            "--timed", "0", "--n-ctx", "4096", "--seed", "59"]
    first = tmp_path / "router.json"
    assert main(["eval", "decide", *data, "--ks", "", "--json", str(first)]) == 0
    r = json.loads(first.read_text())
    assert r["sizes"]["10"]["smollm2"]["router"]["relevant_no_call"] < 1.0  # the default floor lets one through
    save_decide_profile(r["models"]["smollm2"]["fingerprint"], DecideProfile(mode="router", no_value_floor=1.01))
    out = tmp_path / "decide.json"  # now no router score reaches the floor: neither names a value
    assert main(["eval", "decide", *data, "--ks", "3", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["sizes"]["10"]["smollm2"]
    assert r["router"]["relevant_no_call"] == r["nexus"]["relevant_no_call"] == 1.0, r


def _measured(kind: str, p_call: float, lps: dict, gold=None) -> tuple[dict, dict]:
    cands = list(lps)
    return ({"kind": kind, "gold": gold, "key": f"{kind}{p_call}{gold}{cands}"},
            {"p_call": p_call, "lps": lps, "cands": cands, "scores": [0.5] * len(cands), "top1": 0.5, "margin": 0.1})


def test_fit_separates_calls_from_text_and_counters_the_first_listed_bias():
    """The model always prefers the first tool listed; the gold one is second half of the time: the fitted rank
    offset must move those to the second, and the threshold must keep every relevant request a call."""
    rows = []
    for i in range(20):
        gold = "b" if i % 2 else "a"
        lps = {"a": -0.5, "b": -1.0} if gold == "b" else {"a": -0.2, "b": -3.0}
        rows.append(_measured("relevant", 0.6 + 0.01 * i, lps, gold))
        rows.append(_measured("chat", 0.05 + 0.01 * i, {"a": -0.1, "b": -2.0}))
    prof = fit(rows, router_acc=0.0, max_lost=0.0, k=2, fit_all=10)
    assert prof.mode == "model" and prof.rank_bias[1] > 0.5
    assert all(apply(prof, m) == it["gold"] for it, m in rows)
    assert fit(rows, router_acc=1.01, max_lost=0.0, k=2, fit_all=10).mode == "router"  # below the router: router


def test_one_offset_for_every_later_candidate_from_the_middle_of_its_best_range():
    """The router's first pick is right where the model prefers the second (by 1.1 nats) or the third (by 1.5), and
    wrong where the model prefers the third by 5: any offset from -2 to -4 for the later candidates names every tool
    right. The fit gives both later ranks the same offset, from the middle of that range (-3, not the edge -2 that
    one item's gap sits on)."""
    rows = []
    for i in range(6):
        rows.append(_measured("relevant", 0.9, {"a": -2.0, "b": -0.9, "c": -4.0}, "a"))
        rows.append(_measured("relevant", 0.91, {"a": -2.0, "b": -4.0, "c": -0.5}, "a"))
        rows.append(_measured("chat", 0.02 + 0.01 * i, {"a": -0.1, "b": -2.0, "c": -3.0}))
    for i in range(4):
        rows.append(_measured("relevant", 0.92 + 0.01 * i, {"a": -5.1, "b": -6.0, "c": -0.1}, "c"))
    rows = [({**it, "key": f"{it['key']}{j}"}, m) for j, (it, m) in enumerate(rows)]
    prof = fit(rows, router_acc=0.0, max_lost=0.0, k=3, fit_all=10)
    assert prof.rank_bias == [0.0, -3.0, -3.0], prof.rank_bias
    assert all(apply(prof, m) == it["gold"] for it, m in rows)


def test_the_router_weight_on_names_is_fitted_unless_fixed():
    """The router scores the gold tool higher where the model prefers another (listed in either order, so no rank
    offset gets them all): the fit weighs the router's score; `--name-weight 0` keeps the model's preference, a rank
    offset gets half."""
    rows = []
    for i in range(12):
        it, m = _measured("relevant", 0.9, {"a": -0.4, "b": -0.9} if i % 2 else {"b": -0.9, "a": -0.4}, "b")
        m["scores"] = [0.3 if c == "a" else 0.6 for c in m["cands"]]
        rows.append(({**it, "key": f"r{i}"}, m))
    fitted = fit(rows, router_acc=0.0, max_lost=0.0, k=2, fit_all=10)
    assert fitted.name_weight > 0 and all(apply(fitted, m) == "b" for _, m in rows)
    fixed = fit(rows, router_acc=0.0, max_lost=0.0, k=2, fit_all=10, name_weight=0.0)
    assert fixed.name_weight == 0.0 and sum(apply(fixed, m) == "b" for _, m in rows) <= len(rows) // 2


def test_fit_weighs_the_values_a_request_names():
    """Relevant requests and chatter the model and the router cannot tell apart (the same p_call, top-1 and
    margin; the 0.5B Qwen calls a tool for "Bonjour" with p 0.95): the requests name values, the chatter none, so
    the fitted weight on values must be what separates them. Measurements recorded without the count (older
    dumps) get it from the item's last user message."""
    requests = ["Book a table for 4 at Nopa on 2024-05-01", "Convert 12 USD to EUR", "Weather in Paris today?",
                "Email bob@example.org the 'Q3 plan'", "Restart the server at 10.0.0.7"]
    chatter = ["Bonjour, comment ça va ?", "thanks, that's all", "Tell me a joke about programmers.",
               "what do you think makes a good code review comment?", "good night!"]
    rows = []
    for i, text in enumerate(requests * 2):
        it, m = _measured("relevant", 0.9, {"a": -0.1, "b": -3.0}, "a")
        rows.append(({**it, "key": f"r{i}", "messages": [{"role": "user", "content": text}]}, m))
    for i, text in enumerate(chatter * 2):
        it, m = _measured("chat", 0.9, {"a": -0.1, "b": -3.0})
        rows.append(({**it, "key": f"c{i}", "messages": [{"role": "user", "content": text}]}, m))
    prof = fit(rows, router_acc=0.0, max_lost=0.0, k=2, fit_all=10)
    assert prof.w_values > 0 and [m["values"] for _, m in rows[:5]] == [1, 1, 1, 1, 1]
    assert all(m["values"] == 0 for _, m in rows[10:])
    assert all(apply(prof, m) == it["gold"] for it, m in rows)


def test_items_are_a_seeded_sample_of_each_kind(routing_data):
    from evals.decide import DEFAULT_CHAT

    class A:
        queries, irrelevant = str(routing_data / "queries.jsonl"), str(routing_data / "queries_irrelevant.jsonl")
        chat, relevant, n_irrelevant, n_chat, seed = DEFAULT_CHAT, 3, 2, 4, 7

    names = [json.loads(line)["name"] for line in (routing_data / "tools.jsonl").read_text().splitlines()]
    one, two = items(A, names), items(A, names)
    assert one == two and [i["kind"] for i in one] == ["relevant"] * 3 + ["irrelevant"] * 2 + ["chat"] * 4
    assert all(i["gold"] in names for i in one[:3])
    A.history = "answered"  # the same items, asked after two calls and a text answer
    later = items(A, names)
    h = HISTORIES["answered"]
    assert all(i["messages"] == h + j["messages"] and i["key"] != j["key"] for i, j in zip(later, one))


def test_a_reading_beside_the_conversation_decides_as_the_decider_does():
    """The decider reads p(call) beside the conversation while its score says text: a measured item calls where
    the largest reading's score does."""
    prof = DecideProfile(mode="model", bias=0.0, w_model=1.0)
    it, m = _measured("relevant", 0.2, {"a": -0.1, "b": -3.0}, "a")
    assert apply(prof, m) is None
    assert apply(prof, dict(m, p_beside=[0.1, 0.8])) == "a" and apply(prof, dict(m, p_beside=[0.3])) is None


def test_a_bad_profile_file_is_named(nexus_home):
    from nexus_agent.turn.profile import load_decide_profile
    from registry.home import model_profile_path

    path = model_profile_path("f" * 32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"decide": {"mode": "oracle"}}')
    with pytest.raises(ValueError, match="unknown decide mode 'oracle'"):
        load_decide_profile("f" * 32, True)
    assert load_decide_profile("e" * 32, True) == DecideProfile(mode="model")
    assert load_decide_profile("e" * 32, False).mode == "router"


def test_an_item_that_failed_is_neither_a_call_nor_a_text_answer():
    """A variant whose prompt overflows decides nothing: that is wrong for a chat turn too, not a "no call"."""
    from evals.decide_score import row, score

    items = [{"kind": "relevant", "gold": "add"}, {"kind": "irrelevant", "gold": None}, {"kind": "chat", "gold": None}]
    m = score([row(it, None, None) for it in items])
    assert m["failed"] == 3 and m["decision_acc"] == 0.0 and m["tool_acc"] == 0.0
    assert m["irrelevant_no_call"] == 0.0 and m["chat_no_call"] == 0.0 and m["relevant_no_call"] == 0.0


def test_rescore_scores_a_runs_measurements_by_the_setting_shipped_now(nexus_home, tmp_path):
    """A run's `nexus` rows were scored by the setting of its day; `--rescore` scores its dump by today's (here a
    calibrated setting in the Nexus home that calls only for requests naming values) without a model pass."""
    from evals.decide import rescore
    from nexus_agent.turn.profile import save_decide_profile

    fp = "a" * 32
    save_decide_profile(fp, DecideProfile(k=2, k_sure=0, bias=-0.5, w_model=0.0, w_values=1.0, source="test"))
    pairs = []
    for i, text in enumerate(["Convert 12 USD to EUR", "Weather in Paris?", "Bonjour !", "thanks, that's all"]):
        it, m = _measured("relevant" if i < 2 else "chat", 0.9, {"a": -0.1, "b": -3.0}, "a" if i < 2 else None)
        pairs.append(({**it, "messages": [{"role": "user", "content": text}]},
                      {**m, "decide_ms": 1.0, "prefill_ms": 1.0, "prompt_tokens": 10}))
    router = {"decision_acc": 0.5}
    out = tmp_path / "decide.json"
    out.write_text(json.dumps({"models": {"m": {"fingerprint": fp, "template_tools": True}}, "profiles": {"m": {}},
                               "items": {}, "sizes": {"250": {"m": {"router": router, "nexus": router}}}}))
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"m": {"250": {"top2": pairs}}}))

    class A:
        json_out, rescore = str(out), str(dump)

    r = rescore(A)
    assert r["sizes"]["250"]["m"]["nexus"]["decision_acc"] == 1.0 and r["rescored"] == {"m": "test"}
    assert r["profiles"]["m"]["w_values"] == 1.0 and r["sizes"]["250"]["m"]["router"] == router


def test_the_models_near_certain_no_overrules_the_router():
    """`p_veto`: a conversational turn the router's evidence would call (top-1 and margin as high as a request's)
    but the model all but never would (p(call) 0.002) is answered in text, where the model's p(call) is known on
    every reading; the fitted level stays well below every relevant request's p(call) and at most `VETO_CAP`."""
    from evals.decide_fit import VETO_CAP, veto_level

    rows = []
    for i in range(10):
        rows.append(_measured("relevant", 0.3 + 0.05 * i, {"a": -0.1, "b": -3.0}, "a"))
        rows.append(_measured("chat", 0.002 + 0.1 * i, {"a": -0.1, "b": -3.0}))
    assert veto_level(rows) == VETO_CAP
    rows.append(_measured("relevant", 0.066, {"a": -0.1, "b": -3.0}, "a"))
    assert veto_level(rows) == pytest.approx(0.022)
    prof = DecideProfile(k=2, bias=1.0, w_model=0.0, p_veto=veto_level(rows))  # the router's evidence: call
    chat = rows[1][1]
    assert apply(prof, chat) is None and apply(replace(prof, p_veto=0.0), chat) == "a"
    assert apply(prof, dict(chat, p_beside=[0.9])) == "a"  # another reading would call
    assert apply(prof, dict(chat, p_beside=[None])) == "a"  # a reading the backend could not take: not known
    assert all(apply(prof, m) == "a" for it, m in rows if it["kind"] == "relevant")
    with pytest.raises(ValueError, match="p_veto"):
        DecideProfile(p_veto=1.0)


def test_a_spliced_reading_within_the_splice_reach_is_rechecked_on_the_text_reading():
    """The offline twin of the decider's recheck: a spliced measurement within `splice_err` of the other
    call-or-text outcome, or whose chosen name is within `splice_name_err` of another, takes the text prompt's
    decision; beyond that reach the spliced one stands. The reach is the largest distance measured, with slack."""
    from evals.decide_fit import SPLICE_SLACK, rechecked_pick, splice_near, splice_reach

    prof = DecideProfile(mode="model", bias=0.0, w_model=1.0, splice_err=0.5, splice_name_err=0.3)
    _, s = _measured("relevant", 0.55, {"a": -0.2, "b": -0.4}, "a")  # logit 0.2: 0.5 from text would flip it
    _, t = _measured("relevant", 0.45, {"a": -0.5, "b": -0.3}, "a")
    assert apply(prof, s) == "a" and apply(prof, t) is None
    assert splice_near(prof, s) == "call" and rechecked_pick(prof, s, t) == (None, "call")
    s2, t2 = dict(s, p_call=0.9), dict(t, p_call=0.9)  # a sure call, names 0.2 apart: the name is rechecked
    assert splice_near(prof, s2) == "name" and rechecked_pick(prof, s2, t2) == ("b", "name")
    far = dict(s2, lps={"a": -0.1, "b": -2.0})
    assert splice_near(prof, far) is None and rechecked_pick(prof, far, t2) == ("a", None)
    assert splice_near(replace(prof, splice_err=0.0, splice_name_err=0.0), s) is None
    vetoing = replace(prof, bias=5.0, p_veto=0.05)  # the veto's edge is an outcome's edge too
    assert splice_near(vetoing, dict(s, p_call=0.04)) == "call" and splice_near(vetoing, dict(s, p_call=0.2)) != "call"
    err, name_err = splice_reach([(s, t), (s2, t2)])
    assert err == pytest.approx(2 * 0.2007 * SPLICE_SLACK, rel=1e-3)  # |logit 0.55 - logit 0.45|
    assert name_err == pytest.approx(0.4 * SPLICE_SLACK)  # the gap a - b: +0.2 spliced, -0.2 as text
    with pytest.raises(ValueError, match="splice_err"):
        DecideProfile(splice_err=-1.0)


def test_the_figure_has_a_panel_per_model_and_marks_an_overflowed_variant():
    from evals.decide_report import accuracy_figure

    def m(acc, failed=0):
        return {"decision_acc": acc, "failed": failed, "n": 10}

    r = {"sizes": {"10": {"a": {"nexus": m(0.8), "router": m(0.7), "all": m(0.6)}, "b": {"router": m(0.5)}},
                   "250": {"a": {"nexus": m(0.75), "router": m(0.6), "all": m(0.0, failed=10)},
                           "b": {"router": m(0.4)}}}}
    fig = accuracy_figure(r)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["a", "b"]
    lines = {(tuple(ln.get_xdata()), tuple(ln.get_ydata()), ln.get_marker()) for ln in panels[0].get_lines()}
    assert ((10,), (0.6,), "D") in lines and ((250,), (0.0,), "x") in lines  # all: measured at 10, overflowed at 250
    assert ((10, 250), (0.8, 0.75), "o") in lines and len(panels[1].get_lines()) == 1


def _stated(kind: str, h, p_call: float, gold=None, key: str = "") -> tuple[dict, dict]:
    it, m = _measured(kind, p_call, {"a": -0.1, "b": -3.0}, gold)
    return dict(it, key=it["key"] + key), dict(m, h=[float(x) for x in h], values=0)


def test_the_hidden_state_rule_reads_what_p_call_misses():
    """Calls and conversational turns whose p(call) and router evidence are drawn alike, told apart only by a
    direction of the model's state: the fitted hidden-state rule decides fresh items of both right where the
    profile's own rule cannot, loses no more than a few relevant ones, and is used only for items with a state
    (a backend that cannot read it keeps the profile's own rule)."""
    import numpy as np

    from evals.decide_reading import MIN_ITEMS, fit_reading, reading_reach

    rng = np.random.default_rng(7)
    base, u = rng.normal(size=24) * 3, np.eye(24)[0]

    def draw(n, tag):
        rows = []
        for i in range(n):
            rel = i % 2 == 0
            h = base + (2.0 if rel else -2.0) * u + rng.normal(size=24)
            rows.append(_stated("relevant" if rel else "chat", h, float(rng.uniform(0.2, 0.8)),
                                "a" if rel else None, f"{tag}{i}"))
        return rows

    train, fresh = draw(120, "t"), draw(200, "f")
    prof = fit(train, router_acc=0.5, max_lost=0.02, k=2, fit_all=0, reading=True)
    assert not fit(train, router_acc=0.5, max_lost=0.02, k=2, fit_all=0).reading  # only when asked
    assert prof.reading and len(prof.reading["w_hidden"]) == 24 and prof.reading["splice_err"] is None
    right = np.mean([apply(prof, m) == it["gold"] for it, m in fresh])
    lost = np.mean([apply(prof, m) is None for it, m in fresh if it["kind"] == "relevant"])
    own = np.mean([apply(prof, dict(m, h=None)) == it["gold"] for it, m in fresh])  # no state: the own rule
    assert right >= 0.9 and lost <= 0.06 and own <= 0.7, (right, lost, own)
    assert prof.hidden_term(np.r_[fresh[0][1]["h"], 0.0]) is None  # another model's size: no term
    assert prof.hidden_term(np.asarray(fresh[0][1]["h"]) * 3) == pytest.approx(prof.hidden_term(fresh[0][1]["h"]))

    # its splice reach: the largest score distance between a spliced and a text state of the same prompt
    (_, t), (_, s) = fresh[0], fresh[0]
    s = dict(t, h=list(np.asarray(t["h"]) + 0.5 * u))
    gap = abs(prof.call_score(0.5, 0.5, 0.1, 0, prof.hidden_term(s["h"]))
              - prof.call_score(0.5, 0.5, 0.1, 0, prof.hidden_term(t["h"])))
    assert reading_reach(prof, [(dict(s, p_call=0.5), dict(t, p_call=0.5))], slack=1.0) == pytest.approx(gap)
    assert reading_reach(prof, [(dict(s, h=None), t)]) is None
    assert fit_reading(train[: 2 * MIN_ITEMS - 2], 0.0) == {}  # too few of a class: no rule
    with pytest.raises(ValueError, match="w_hidden"):
        DecideProfile(reading={"bias": 0.0})
