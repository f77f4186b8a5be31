"""MCP server faults through the agent's ServerPool: crashes, hangs, garbage and huge results never end a session."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from nexus_agent.servers import ServerPool, ServerPoolConfig

SERVER = Path(__file__).resolve().parent / "fault_server.py"
CMD = f"{sys.executable} {SERVER}"
TOOLS = ["echo", "crash_mid_call", "crash_after_reply", "hang", "garbage", "huge"]


def pool(cmd: str = CMD, **config) -> ServerPool:
    return ServerPool({"faulty": cmd}, {t: "faulty" for t in TOOLS}, ServerPoolConfig(**config))


def echo_ok(p: ServerPool, text: str = "still here"):
    obs = p.call("echo", {"text": text})
    assert obs.status == "ok" and json.loads(obs.text) == {"text": text}, obs
    return obs


def test_crash_at_start(fault):
    f = fault("server exits at start", "nexus_agent.servers",
              "server_error observation naming the server; no exception")
    with pool(f"{CMD} --crash-at-start", start_timeout_s=10) as p:
        obs = p.call("echo", {"text": "hi"})
        assert obs.status == "server_error" and "faulty" in obs.text
        again = p.call("echo", {"text": "hi"})
        assert again.status == "server_error"
    f.observe(f"status={obs.status} naming server 'faulty' and the exit; next call server_error too")


def test_crash_mid_call_then_recover(fault):
    f = fault("server dies mid-call", "nexus_agent.servers", "server_error, then restart and the next call answers")
    with pool() as p:
        obs = p.call("crash_mid_call", {})
        assert obs.status == "server_error" and "faulty" in obs.text
        p._servers["faulty"].restarts = 0  # a new turn: the user's next request gets a fresh restart
        after = echo_ok(p)
    f.observe(f"{obs.status}, then echo ok (restarted={after.restarted}, starts={p.starts('faulty')})")


def test_crash_between_calls_is_retried(fault):
    f = fault("server dies between calls", "nexus_agent.servers", "next call restarts the server and retries once: ok")
    with pool() as p:
        first = p.call("crash_after_reply", {})
        assert first.status == "ok"
        time.sleep(0.6)  # the server is dead now
        after = echo_ok(p)
        assert after.restarted and p.starts("faulty") == 2
    f.observe(f"first ok, second ok after restart (starts={p.starts('faulty')})")


def test_hung_tool_times_out(fault):
    f = fault("tool hangs", "nexus_agent.servers", "timeout observation within the call timeout; server restarted")
    with pool(call_timeout_s=1.5) as p:
        t0 = time.perf_counter()
        obs = p.call("hang", {"seconds": 120})
        took = time.perf_counter() - t0
        # "timeout" is the proof the call did not wait for the 120 s tool; `took` is reported, not bounded (a
        # wall-clock limit fails on a busy machine)
        assert obs.status == "timeout" and "did not answer within 1.5 s" in obs.text
        after = echo_ok(p)
        assert after.restarted
    f.observe(f"timeout after {took:.1f} s, next call ok after restart")


def test_garbage_on_protocol_stream(fault):
    f = fault("server writes garbage to stdout", "registry.client",
              "garbage line ignored or server_error; session goes on")
    with pool(call_timeout_s=10) as p:
        obs = p.call("garbage", {})
        assert obs.status in ("ok", "server_error"), obs
        if obs.status == "ok":
            assert "answered after garbage" in obs.text
        p._servers["faulty"].restarts = 0
        echo_ok(p)
    f.observe(f"status={obs.status}; next call ok")


def test_ten_megabyte_result_is_capped(fault):
    f = fault("10 MB tool result", "nexus_agent.servers", "ok; text for the model capped with a note, full result kept")
    with pool(call_timeout_s=60) as p:
        obs = p.call("huge", {"mb": 10})
        assert obs.status == "ok"
        assert len(obs.text) <= p.config.max_result_chars + 200 and "truncated" in obs.text
        assert len(obs.result["blob"]) == 10 * 1024 * 1024  # nothing lost: the structured result is whole
        echo_ok(p)
    f.observe(f"ok; model text {len(obs.text)} chars with a truncation note; result intact (10 MiB)")


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="max_result_chars"):
        ServerPoolConfig(max_result_chars=0)


@pytest.mark.parametrize("mode", ["crash", "hang"])
def test_registering_a_broken_server_writes_nothing(nexus_home, fault, mode):
    from registry.client import ServerError
    from registry.sources import register_server
    from registry.store import RegistryStore

    f = fault(f"server {'exits' if mode == 'crash' else 'hangs'} at start during `nexus register`", "registry.sources",
              "ServerError naming the command (with its stderr); registry unchanged")
    cmd = f"{CMD} --crash-at-start" if mode == "crash" else f"{sys.executable} -c 'import time; time.sleep(60)'"
    with RegistryStore() as store:
        register_server(f"{CMD}", store, timeout_s=20)
        before = [t.name for t in store.list_tools()]
        with pytest.raises(ServerError) as e:
            register_server(cmd, store, timeout_s=2, name="broken")
        assert "failed to start" in str(e.value)
        assert mode == "hang" or "crashing at start on purpose" in str(e.value)
        assert [t.name for t in store.list_tools()] == before and [s.name for s in store.list_servers()] == ["faulty"]
    shown = "its stderr" if mode == "crash" else "the 2 s timeout"
    f.observe(f"ServerError 'failed to start' with {shown}; registry unchanged", lost=0)
