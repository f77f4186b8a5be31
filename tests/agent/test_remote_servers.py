"""ServerPool and `nexus doctor` against remote servers: real bundled and probe servers over streamable HTTP on
127.0.0.1, killed and restarted by PID, a tool that hangs past the call timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nexus_agent.doctor import check_servers
from nexus_agent.servers import ServerPool, ServerPoolConfig
from registry.sources import register_remote
from registry.store import RegistryStore

PROBE = str(Path(__file__).with_name("probe_server.py"))


@pytest.fixture
def store(nexus_home):
    with RegistryStore() as s:
        yield s


def test_call_a_remote_bundled_server_through_the_pool(store, http_server):
    srv = http_server("registry.servers.calculator")
    register_remote(srv.url, store)
    with ServerPool.from_store(store) as pool:
        assert pool.running() == []
        obs = pool.call("evaluate", {"expression": "(2 + 3) * 4"})
        again = pool.call("divide", {"numerator": 1, "denominator": 0})
        assert obs.status == "ok" and json.loads(obs.text) == {"result": 20}
        assert again.status == "tool_error" and "division by zero" in again.text
        assert pool.starts("calculator") == 1 and pool.running() == ["calculator"]


def test_pool_reconnects_after_the_remote_server_is_killed_and_restarted(store, http_server, nexus_home):
    srv = http_server(PROBE)
    register_remote(srv.url, store)
    with ServerPool.from_store(store, ServerPoolConfig(call_timeout_s=10)) as pool:
        assert pool.call("record_sum", {"a": 1, "b": 2}).status == "ok"
        srv.restart()  # same port, new process: the old MCP session is gone
        obs = pool.call("record_sum", {"a": 3, "b": 4})
        assert obs.status == "ok" and obs.restarted and json.loads(obs.text) == {"sum": 7}, obs
        assert pool.starts("probe") == 2
        srv.kill()  # down for good: a clear observation, no exception
        down = pool.call("record_sum", {"a": 5, "b": 6})
        assert down.status in ("server_error", "timeout") and "probe" in down.text, down
    calls = [json.loads(x)["arguments"] for x in (nexus_home / "probe_calls.jsonl").read_text().splitlines()]
    assert calls == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]


def test_hung_remote_tool_times_out_and_the_pool_recovers(store, http_server):
    srv = http_server(PROBE)
    register_remote(srv.url, store)
    with ServerPool.from_store(store, ServerPoolConfig(call_timeout_s=2.0)) as pool:
        obs = pool.call("sleep_for", {"seconds": 60})  # "timeout": the call did not wait for the 60 s tool
        assert obs.status == "timeout" and "did not answer within 2 s" in obs.text
        after = pool.call("record_sum", {"a": 1, "b": 2})
        assert after.status == "ok" and after.restarted and json.loads(after.text) == {"sum": 3}


def test_doctor_reports_a_remote_server(store, http_server):
    srv = http_server("registry.servers.calculator")
    register_remote(srv.url, store)
    [(name, ok, detail)] = check_servers(store)
    assert (name, ok) == ("server calculator", True) and detail == f"4 tools at {srv.url} (streamable HTTP)"
    srv.kill()
    [(name, ok, detail)] = check_servers(store)
    assert not ok and srv.url in detail and "failed to start" in detail
