"""Tool names as agent frameworks rewrite them route as the servers' own names: pydantic-ai's `time_convert_time`,
`git_git_show` and the OpenAI Agents SDK's `mcp_git__git_show` get the label the server gave the tool, the
routing texts use it, and the router's choices and scores over the real mcp-server-time and mcp-server-git tools
match the originals', while the candidates answer with the names the client sent."""

from __future__ import annotations

import sys

import pytest

from slb.tools import ToolEntry, as_entry, lexical_text, server_prefix_labels, strip_server_prefixes, tool_text

STYLES = {  # how each framework names tool T of server S
    "pydantic-ai": lambda s, t: f"{s}_{t}",
    "openai-agents": lambda s, t: f"mcp_{s}__{t}",
    "double underscore": lambda s, t: f"mcp__{s}__{t}",
}
QUERIES = ["What time is it in Tokyo right now?", "Show the last 3 commits of the repository at /tmp/repo",
           "Convert 9:30 in New York to London time", "What is the status of the repository at /tmp/repo?",
           "Show me the commit abc123 in /tmp/repo", "Create a branch named feature in /tmp/repo",
           "Stage the file notes.txt in /tmp/repo", "Which branches does /tmp/repo have?"]


def test_a_shared_leading_word_goes_where_the_name_repeats_it():
    names = ["time_get_current_time", "time_convert_time", "git_git_status", "git_git_log", "fetch_fetch"]
    assert server_prefix_labels(names) == ["get_current_time", "convert_time", "git_status", "git_log",
                                           "fetch_fetch"]  # one fetch tool: no group, so no prefix to drop
    assert server_prefix_labels(["mcp_time__convert_time", "mcp__git__git_log", "srv__do_it"]) == [
        "convert_time", "git_log", "do_it"]


def test_a_servers_own_names_and_ordinary_lists_stay_as_they_are():
    names = ["git_status", "git_log", "get_weather", "get_time", "calc.triangle_area", "calc.circle_area",
             "list_lists", "__init__", "a__"]
    assert server_prefix_labels(names) == names


def test_the_label_feeds_the_routing_texts_and_the_hash_but_not_the_name():
    plain = ToolEntry("convert_time", "Convert time between timezones.")
    (prefixed,) = strip_server_prefixes([ToolEntry("mcp_time__convert_time", "Convert time between timezones.")])
    assert prefixed.name == "mcp_time__convert_time" and prefixed.label == "convert_time"
    assert tool_text(prefixed) == tool_text(plain) and lexical_text(prefixed) == lexical_text(plain)
    assert prefixed.schema_hash not in (plain.schema_hash, ToolEntry("mcp_time__convert_time",
                                                                     "Convert time between timezones.").schema_hash)


@pytest.fixture(scope="module")
def server_tools() -> dict[str, list[dict]]:
    """The tools the real time and git servers list (test dependencies from PyPI)."""
    pytest.importorskip("mcp_server_time")
    pytest.importorskip("mcp_server_git")
    from registry.client import list_server_tools

    return {s: list_server_tools(f"{sys.executable} -m mcp_server_{s}")[1] for s in ("time", "git")}


def _router(embedder, tools: list[dict]):
    """A gate-mode router over the request's tools, built as `nexus serve` builds one."""
    from slb.buffer import quantize_rows
    from slb.index import ScanIndex
    from slb.router import Router

    entries = strip_server_prefixes([as_entry(t) for t in tools])
    m8, scales = quantize_rows(embedder.embed_texts([tool_text(e, embedder.config.recipe) for e in entries]))
    return Router(embedder, ScanIndex(m8, scales), entries, mode="gate")


@pytest.mark.parametrize("style", STYLES)
def test_prefixed_names_route_as_the_servers_own_names(embedder, server_tools, style):
    rename = STYLES[style]
    original = [t for ts in server_tools.values() for t in ts]
    prefixed = [dict(t, name=rename(s, t["name"])) for s, ts in server_tools.items() for t in ts]
    back = {rename(s, t["name"]): t["name"] for s, ts in server_tools.items() for t in ts}
    plain, framed = _router(embedder, original), _router(embedder, prefixed)
    for q in QUERIES:
        a, b = plain.route(q), framed.route(q)
        assert b.tool is None or b.tool in back  # the client's names come back
        assert (a.tool, a.path) == (back.get(b.tool), b.path), q
        assert [c[0] for c in a.candidates] == [back[c[0]] for c in b.candidates], q
        assert [c[1] for c in a.candidates] == pytest.approx([c[1] for c in b.candidates], abs=1e-6), q
    assert plain.route(QUERIES[1]).tool == "git_log"
