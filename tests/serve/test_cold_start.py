"""A restart of `nexus serve` embeds no tool it has seen: the first server embeds a catalogue tool list into the
SQLite embedding store of its Nexus home; a second server on the same home answers the first request of that
list with 0 embedded (its log line and /v1/nexus/stats say so). 100 tools here (embedding 1,000 takes ~30 s
on one core); `nexus eval serve --cold-start 1000` measures the 1,000-tool case."""

from __future__ import annotations

import re
import sqlite3

import pytest
from serve_helpers import ADD, catalogue_tools, post, running_serve, stats

pytestmark = pytest.mark.slow

N = 100
ASK = [{"role": "user", "content": "What is 12 plus 30?"}]


def tool_list_lines(home) -> list[tuple[int, int, int]]:
    """(tools, embedded, from the store) of every `nexus serve: tool list of ...` log line, in order."""
    text = (home / "server.log").read_text()
    return [tuple(map(int, m)) for m in
            re.findall(r"nexus serve: tool list of (\d+) tools: (\d+) embedded, (\d+) from the store", text)]


def test_a_restarted_server_embeds_nothing_it_has_seen(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    tools = catalogue_tools(N - 1) + [ADD]
    body = {"model": "smollm2", "messages": ASK, "tools": tools, "max_tokens": 32}
    with running_serve(home, "--n-ctx", "4096") as url:
        status, reply = post(url, body)
        assert status == 200, reply
        first = stats(url)
    assert tool_list_lines(home)[-1] == (N, N, 0)
    assert first["tools_embedded"] == N + 1 and first["tools_from_store"] == 0  # + the warm-up tool
    with sqlite3.connect(home / "slb" / "embeddings.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM vectors").fetchone()[0] == N + 1

    with running_serve(home, "--n-ctx", "4096") as url:
        status, again = post(url, body)
        assert status == 200, again
        restarted = stats(url)
    assert tool_list_lines(home) == [(1, 0, 1), (N, 0, N)]  # the warm-up tool, then the request's list
    assert restarted["tools_embedded"] == 0 and restarted["tools_from_store"] == N + 1
    assert called(again) == called(reply) == ["add"]  # the stored vectors route as the fresh ones did


def called(reply: dict) -> list[str]:
    return [c["function"]["name"] for c in reply["choices"][0]["message"].get("tool_calls") or []]
