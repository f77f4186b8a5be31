"""`nexus mcp`: Nexus itself as one MCP server in front of every registered server.

A client with a small context cannot read hundreds of tool schemas, so the gateway offers two tools:
- `find_tools(request, k)`: the top-k tools for a plain-language request from the SLB router the agent uses
  (name, description, inputSchema, score: the cosine of the scan; the router's pick first), and
- `call_tool(name, arguments)`: the arguments are checked against the tool's registered input schema with
  jsonschema, then the call is proxied to its server through a ServerPool (started lazily, restarted once).
When at most `list_limit` tools are registered they are also listed under their own names and callable
directly. Every failure (unknown tool, bad arguments, a server that crashed or timed out) is an MCP tool
error the client reads; nothing raises out of a handler.

`Gateway` is the synchronous library API (tests call it directly); `build_server` wraps it in the SDK's
low-level `Server`, served over stdio or streamable HTTP by `serve`.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass
from typing import Any

MAX_K = 25
FIND_TOOLS = {
    "name": "find_tools",
    "description": "Find the tools that can do a request, best first. Returns each tool's name, description, "
                   "inputSchema and a relevance score; then call one with call_tool.",
    "inputSchema": {"type": "object", "required": ["request"], "additionalProperties": False, "properties": {
        "request": {"type": "string", "minLength": 1, "description": "what you want to do, in plain words"},
        "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "default": 5, "description": "tools to return"},
    }},
}
CALL_TOOL = {
    "name": "call_tool",
    "description": "Call a tool found by find_tools. `arguments` must match that tool's inputSchema.",
    "inputSchema": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
        "name": {"type": "string", "description": "the tool's name as find_tools returned it"},
        "arguments": {"type": "object", "default": {}, "description": "the tool's arguments"},
    }},
}
OWN_TOOLS = (FIND_TOOLS, CALL_TOOL)


@dataclass
class GatewayConfig:
    """list_limit: also list every registered tool directly when there are at most this many (0: never);
    route_mode: gate | embed | rerank (slb.router)."""

    list_limit: int = 20
    route_mode: str = "gate"

    def __post_init__(self):
        if self.list_limit < 0:
            raise ValueError(f"list_limit must be >= 0, got {self.list_limit}")
        if self.route_mode not in ("gate", "embed", "rerank"):
            raise ValueError(f"unknown route mode {self.route_mode!r}; choose gate, embed or rerank")


@dataclass
class Reply:
    """A gateway tool's answer: JSON-able `value` (a dict becomes structured content) or an error text."""

    value: Any
    is_error: bool = False

    @property
    def text(self) -> str:
        return self.value if isinstance(self.value, str) else json.dumps(self.value, ensure_ascii=False)


class Gateway:
    """find_tools / call_tool over a RegistryStore and a ServerPool. Thread-safe: the router is opened once
    (on first use: it loads the embedder and rebuilds a stale buffer) and each server takes one call at a time."""

    def __init__(self, store, pool=None, config: GatewayConfig | None = None):
        from nexus_agent.servers import ServerPool

        self.store, self.config = store, config or GatewayConfig()
        self.tools = {t.name: t for t in store.list_tools()}
        if not self.tools:
            raise ValueError("no tools are registered: run `nexus register --config FILE` (or --server, --url, "
                             "--bundled calculator) first")
        self.pool = pool or ServerPool.from_store(store)
        self._router = None
        self._router_lock = threading.Lock()
        self._server_locks = {name: threading.Lock() for name in {t.server for t in self.tools.values()}}

    def listed_tools(self) -> list[dict]:
        """The MCP tool objects this server lists: its own two, plus every registered one if few enough."""
        own = [dict(t) for t in OWN_TOOLS]
        if len(self.tools) > self.config.list_limit:
            return own
        names = {t["name"] for t in own}
        return own + [t.to_mcp() for n, t in sorted(self.tools.items()) if n not in names]

    def router(self):
        with self._router_lock:
            if self._router is None:
                from nexus_agent.session import ensure_router

                self._router = ensure_router(self.store, self.config.route_mode, _log)
            return self._router

    def find_tools(self, request: str, k: int = 5) -> Reply:
        """The top-`k` routed tools for `request` (the router's choice first, then by cosine)."""
        router = self.router()
        qvec = router.embedder.embed_query(request)
        decision = router.route(request, qvec)
        order = [(n, s) for n, s, *_ in decision.candidates]
        if k > len(order):
            scores, ids = router.index.scan(qvec, k)
            order = [(router.tools[int(i)].name, float(v)) for v, i in zip(scores, ids)]
        if decision.tool is not None:
            order.sort(key=lambda c: c[0] != decision.tool)  # stable: the pick first, the rest by cosine
        found = []
        for name, score in order[:k]:
            tool = self.tools.get(name)
            if tool is not None:
                found.append({"name": name, "description": tool.description, "inputSchema": tool.input_schema,
                              "score": round(score, 4)})
        note = {"auto": "the first tool is a confident match", "rerank": "the first tool is the router's pick "
                "among close candidates", "none": "no registered tool matches this request well"}[decision.path]
        return Reply({"tools": found, "routing": decision.path, "note": note})

    def call_tool(self, name: str, arguments: dict | None) -> Reply:
        """Validate `arguments` against `name`'s registered schema, then call it on its server."""
        from registry.model import arguments_error

        tool = self.tools.get(name)
        if tool is None:
            return Reply(f"unknown tool {name!r}: call find_tools to see which tools exist", True)
        arguments = {} if arguments is None else arguments
        error = arguments_error(name, tool.input_schema, arguments)
        if error is not None:
            return Reply(f"{error}; its inputSchema is {json.dumps(tool.input_schema)}", True)
        if tool.server not in self._server_locks or tool.server is None:
            return Reply(f"tool {name!r} was registered from a file, not a server: nothing can run it", True)
        with self._server_locks[tool.server]:
            obs = self.pool.call(name, arguments)
        if not obs.ok:
            return Reply(f"{obs.status}: {obs.text}", True)
        return Reply(obs.result if isinstance(obs.result, dict) else obs.text)

    def handle(self, name: str, arguments: dict | None) -> Reply:
        """One MCP `tools/call` to the gateway: its own tools, or a directly listed registered tool."""
        arguments = arguments or {}
        own = {t["name"]: t for t in OWN_TOOLS}
        if name in own:
            from registry.model import arguments_error

            error = arguments_error(name, own[name]["inputSchema"], arguments)
            if error is not None:
                return Reply(error, True)
            if name == "find_tools":
                return self.find_tools(arguments["request"], arguments.get("k", 5))
            return self.call_tool(arguments["name"], arguments.get("arguments"))
        if len(self.tools) > self.config.list_limit:
            return Reply(f"unknown tool {name!r}: this server offers find_tools and call_tool", True)
        return self.call_tool(name, arguments)

    def close(self) -> None:
        self.pool.close()


def _log(line: str) -> None:
    print(f"nexus mcp: {line}", file=sys.stderr, flush=True)  # stdout is the MCP stream over stdio


def build_server(gateway: Gateway):
    """The SDK low-level `Server` answering tools/list and tools/call from `gateway` (handlers run in worker
    threads: routing and proxied calls block)."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    listed = [types.Tool.model_validate(t) for t in gateway.listed_tools()]

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params) -> types.CallToolResult:
        try:
            reply = await anyio.to_thread.run_sync(gateway.handle, params.name, params.arguments)
        except Exception as e:  # noqa: BLE001 - a bug or a broken buffer must reach the client, not end the server
            reply = Reply(f"nexus gateway failed on {params.name!r}: {type(e).__name__}: {e}", True)
        structured = reply.value if isinstance(reply.value, dict) and not reply.is_error else None
        return types.CallToolResult(content=[types.TextContent(type="text", text=reply.text)],
                                    structured_content=structured, is_error=reply.is_error)

    instructions = (f"Nexus fronts {len(gateway.tools)} tools of {len(gateway._server_locks)} MCP servers. Call "
                    "find_tools with what you want to do, then call_tool with a returned name and arguments that "
                    "match its inputSchema.")
    return Server("nexus", version="0.1.0", instructions=instructions, on_list_tools=list_tools,
                  on_call_tool=call_tool)


def serve(config: GatewayConfig | None = None, http: bool = False, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve the gateway over the Nexus home registry: stdio (default) or streamable HTTP on host:port."""
    import anyio

    from registry.servers.runtime import serve_http
    from registry.store import RegistryStore

    with RegistryStore() as store:
        gateway = Gateway(store, config=config)
        try:
            server = build_server(gateway)
            if http:
                serve_http(server, "http", host, port)
                return
            from mcp.server.stdio import stdio_server

            async def main():
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())

            anyio.run(main)
        finally:
            gateway.close()
