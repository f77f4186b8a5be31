"""`nexus serve` compiles a new tool list's schema blocks between requests and keeps them in its home: after the
first request of a 14-tool list (more than Qwen2.5-Coder-0.5B's profile shows at once), the server compiles the
other tools' blocks while idle (/v1/nexus/stats says how many are pending), the same request again compiles
nothing, and a restarted server on the same home reads the candidates' blocks from their files, with the same
call as the first answer."""

from __future__ import annotations

import json
import time

import pytest
from serve_helpers import ADD, API_KEY, catalogue_tools, function, post, running_serve, stats

pytestmark = pytest.mark.slow

TIME = function("get_current_time", "Get the current time in a specific IANA timezone.",
                {"type": "object", "properties": {"timezone": {"type": "string", "description":
                 "IANA timezone name (e.g. 'America/New_York', 'Europe/London')"}}, "required": ["timezone"]})
ASK = [{"role": "user", "content": "What time is it in Tokyo right now? Use Asia/Tokyo."}]


def calls(reply: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in reply["choices"][0]["message"].get("tool_calls") or []]


def idle_done(url: str, timeout: float = 300.0) -> dict:
    """The block counts once nothing is pending (the server compiles one tool's prefill at a time)."""
    t0 = time.monotonic()
    while (b := stats(url)["blocks"])["pending"] and time.monotonic() - t0 < timeout:
        time.sleep(1.0)
    return b


def test_a_tool_list_is_compiled_while_idle_and_kept_across_a_restart(tmp_path, qwen_gguf):
    home = tmp_path / "home"
    home.mkdir()
    tools = catalogue_tools(12) + [ADD, TIME]
    with running_serve(home, "--model", qwen_gguf, "--n-ctx", "4096") as url:
        body = {"model": _model(url), "messages": ASK, "tools": tools, "max_tokens": 64}
        status, first = post(url, body)
        assert status == 200, first
        done = idle_done(url)
        # every tool right after the tools preamble, while idle: the request's own 5 candidates were compiled
        # where they stood, and the 4 below the first are compiled again there (spliced first, they need no repair);
        # one more block: the template's text after the tools, compiled where the first request showed it
        assert done["pending"] == 0 and len(tools) + 1 <= done["compiled"] <= len(tools) + 5
        files = list((home / "blocks").rglob("*.kvb"))
        assert len(files) == len(tools) + 1
        status, again = post(url, body)
        assert status == 200 and stats(url)["blocks"]["compiled"] == done["compiled"]  # spliced, nothing compiled
    assert calls(first) == calls(again) == [("get_current_time", {"timezone": "Asia/Tokyo"})]
    with running_serve(home, "--model", qwen_gguf, "--n-ctx", "4096") as url:
        status, restarted = post(url, dict(body, model=_model(url)))
        assert status == 200, restarted
        b = stats(url)["blocks"]
    assert b["compiled"] == 0 and b["loaded"] >= 1  # every candidate from its file
    assert calls(restarted) == calls(first)


def _model(url: str) -> str:
    import urllib.request

    req = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["data"][0]["id"]
