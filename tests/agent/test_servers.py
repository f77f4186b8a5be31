"""ServerPool against the real probe MCP server: lazy start, keep alive, crash restart, hang timeout, a failure
answered as a plain result."""

from __future__ import annotations

import json

from nexus_agent.servers import Observation, ServerPool, ServerPoolConfig


def test_lazy_start_and_keep_alive(probe_store, nexus_home):
    with ServerPool.from_store(probe_store) as pool:
        assert pool.running() == []
        a = pool.call("record_sum", {"a": 2, "b": 3})
        b = pool.call("record_sum", {"a": 4, "b": 5})
        assert (a.status, b.status) == ("ok", "ok")
        assert json.loads(b.text) == {"sum": 9}
        assert pool.starts("probe") == 1  # the second call reused the running server
    lines = (nexus_home / "probe_calls.jsonl").read_text().splitlines()
    assert [json.loads(x)["arguments"] for x in lines] == [{"a": 2, "b": 3}, {"a": 4, "b": 5}]


def test_crashed_server_is_restarted_once(probe_store):
    with ServerPool.from_store(probe_store) as pool:
        obs = pool.call("crash_once", {})
        assert obs.status == "ok" and obs.restarted and "recovered" in obs.text
        assert pool.starts("probe") == 2


def test_server_that_keeps_crashing_gives_clear_observation(probe_store):
    with ServerPool.from_store(probe_store) as pool:
        obs = pool.call("always_crash", {})
        assert obs.status == "server_error"
        assert "probe" in obs.text and "failed" in obs.text
        again = pool.call("record_sum", {"a": 1, "b": 1})  # restarts are spent: a clear refusal, no exception
        assert again.status == "server_error" and "already restarted" in again.text


def test_hung_tool_times_out_and_server_recovers(probe_store):
    with ServerPool.from_store(probe_store, ServerPoolConfig(call_timeout_s=2.0)) as pool:
        obs = pool.call("sleep_for", {"seconds": 60})  # "timeout": the call did not wait for the 60 s tool
        assert obs.status == "timeout" and "did not answer within 2 s" in obs.text
        after = pool.call("record_sum", {"a": 1, "b": 2})
        assert after.status == "ok" and after.restarted and json.loads(after.text) == {"sum": 3}


def test_unknown_tool_and_tool_error(probe_store):
    with ServerPool.from_store(probe_store) as pool:
        assert pool.call("no_such_tool", {}).status == "no_server"
        bad = pool.call("record_sum", {"a": "x", "b": 1})  # the server's own schema check rejects it
        assert bad.status == "tool_error" and "record_sum" in bad.text


def test_a_failure_answered_as_a_result_is_not_confirmed(probe_store):
    """Only a confirmed call teaches the router (slb.learn): a plain result that reports a failure is ok for the
    protocol, not confirmed."""
    with ServerPool.from_store(probe_store) as pool:
        missing = pool.call("city_population", {"city": "Atlantis"})
        assert missing.status == "ok" and "Atlantis" in missing.text and not missing.confirmed
        assert pool.call("record_sum", {"a": 1, "b": 2}).confirmed
    seen = ["Error converting time: Invalid timezone: 'Australia'", "Database error: no such table: users",
            '{"status": "error", "message": "[Errno -2] Name or service not known"}']  # third-party servers' words
    assert not any(Observation("t", "ok", text).confirmed for text in seen)
    assert Observation("t", "ok", "[{'name': 'products'}]").confirmed
    assert not Observation("t", "tool_error", "42").confirmed
