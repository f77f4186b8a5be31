"""`nexus mcp` driven by the MCP SDK's own stdio client: find a bundled server's tool by a request, call it through
the gateway, and get bad arguments and unknown tools back as tool errors (the server keeps serving)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from nexus_agent.gateway import Gateway, GatewayConfig
from registry.sources import register_server
from registry.store import RegistryStore

REPO = Path(__file__).resolve().parents[2]


def _register(*names: str) -> None:
    with RegistryStore() as store:
        for name in names:
            register_server(f"python -m registry.servers.{name}", store, cwd=str(REPO))


@pytest.mark.slow  # ~30 s: the gateway process loads the embedder and builds the SLB buffer
def test_nexus_mcp_over_stdio(nexus_home):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    _register("calculator", "units", "clock")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH", "HF_HUB_OFFLINE",
                                                          "OMP_NUM_THREADS", "NEXUS_THREADS", "TMPDIR")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "nexus_agent.cli", "mcp"], cwd=str(REPO),
                                   env=env | {"NEXUS_HOME": str(nexus_home), "TOKENIZERS_PARALLELISM": "false"})

    async def session():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            with anyio.fail_after(120):
                init = await client.initialize()
                assert init.server_info.name == "nexus" and "find_tools" in (init.instructions or "")
                listed = {t.name: t for t in (await client.list_tools()).tools}
                assert {"find_tools", "call_tool", "convert", "evaluate"} <= set(listed)  # 13 tools: listed too

                found = await client.call_tool("find_tools", {"request": "convert 100 degrees Celsius to Fahrenheit",
                                                              "k": 3})
                assert not found.is_error, found.content
                tools = found.structured_content["tools"]
                assert len(tools) == 3 and tools[0]["name"] == "convert"
                assert tools[0]["inputSchema"]["type"] == "object" and tools[0]["score"] > tools[2]["score"] - 1e-6

                called = await client.call_tool("call_tool", {"name": "convert", "arguments": {
                    "value": 100, "from_unit": "C", "to_unit": "F"}})
                assert not called.is_error and called.structured_content == {"value": 212.0, "unit": "F"}

                bad = await client.call_tool("call_tool", {"name": "add", "arguments": {"a": "x", "b": 1}})
                assert bad.is_error and "invalid arguments for add: $.arguments.a" in bad.content[0].text

                unknown = await client.call_tool("call_tool", {"name": "no_such_tool", "arguments": {}})
                assert unknown.is_error and "call find_tools" in unknown.content[0].text
                missing = await client.call_tool("find_tools", {"k": 3})
                assert missing.is_error and "'request' is a required property" in missing.content[0].text

                direct = await client.call_tool("multiply", {"a": 6, "b": 7})  # listed tools are callable by name
                assert not direct.is_error and direct.structured_content == {"result": 42}
                failed = await client.call_tool("divide", {"numerator": 1, "denominator": 0})
                assert failed.is_error and "division by zero" in failed.content[0].text

    anyio.run(session)


def test_only_the_two_gateway_tools_are_listed_above_the_limit(nexus_home):
    _register("calculator", "units")
    with RegistryStore() as store:
        gateway = Gateway(store, config=GatewayConfig(list_limit=5))
        try:
            assert [t["name"] for t in gateway.listed_tools()] == ["find_tools", "call_tool"]
            refused = gateway.handle("multiply", {"a": 1, "b": 2})  # not listed: only through call_tool
            assert refused.is_error and "find_tools and call_tool" in refused.value
            assert gateway.handle("call_tool", {"name": "multiply", "arguments": {"a": 2, "b": 4}}).value == \
                {"result": 8}
        finally:
            gateway.close()


def test_nexus_mcp_over_streamable_http(nexus_home, http_server):
    """`nexus mcp --http` as a remote server of another MCP client (our own): listed tools and a proxied call."""
    from registry.client import RemoteServer, SyncToolClient

    _register("calculator")
    srv = http_server("nexus_agent.cli", "mcp", "--list-limit", "0")
    with SyncToolClient(RemoteServer(srv.url), timeout_s=30) as client:
        assert [t["name"] for t in client.list_tools()] == ["find_tools", "call_tool"]
        r = client.call_tool("call_tool", {"name": "evaluate", "arguments": {"expression": "2 ** 10"}})
        assert not r.is_error and r.structured == {"result": 1024}
        bad = client.call_tool("call_tool", {"name": "evaluate", "arguments": {"expr": "1"}})
        assert bad.is_error and "'expression' is a required property" in bad.text


def test_a_second_servers_tool_of_the_same_name_is_reached_under_its_servers_name(nexus_home):
    """The same real server registered twice (as `calc` and `calc2`): every tool of the second has a name the
    first holds, so it is registered as `calc2.NAME` and called on the second server by its own name."""
    from nexus_agent.servers import ServerPool

    with RegistryStore() as store:
        register_server("python -m registry.servers.calculator", store, cwd=str(REPO), name="calc")
        report = register_server("python -m registry.servers.calculator", store, cwd=str(REPO), name="calc2")
        assert report.ok and ("multiply", "calc2.multiply", "calc") in report.renamed
        assert {"multiply", "calc2.multiply"} <= {t.name for t in store.list_tools()}
        pool = ServerPool.from_store(store)
        try:
            obs = pool.call("calc2.multiply", {"a": 6, "b": 7})
            assert obs.status == "ok" and "42" in obs.text and pool.running() == ["calc2"]
        finally:
            pool.close()
        gateway = Gateway(store, config=GatewayConfig(list_limit=0))
        try:
            assert gateway.handle("call_tool", {"name": "calc2.add", "arguments": {"a": 2, "b": 3}}).value == \
                {"result": 5}
        finally:
            gateway.close()
