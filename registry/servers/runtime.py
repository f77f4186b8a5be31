"""The shared runtime of the bundled MCP servers, on the `mcp` SDK's low-level `Server` over stdio, or over
streamable HTTP (`--http`) or legacy SSE (`--sse`) on 127.0.0.1 (`--port`, default a free one; the URL is printed
on stderr; `--bearer TOKEN` requires `Authorization: Bearer TOKEN`).

A server is a name plus a list of `Handler`s (a validated `Tool` and a Python callable). The runtime
- answers `tools/list` in pages of `page_size` tools with a `nextCursor` (large catalogues need pagination);
- validates each call's arguments against the tool's own input schema with `jsonschema` before the handler
  runs, and refuses keys a keyword handler's function does not take (even where a schema leaves objects open),
  so a handler only ever sees arguments its schema allows and its signature accepts;
- runs the handler in a worker thread, so a slow tool does not stall the server (pings, other HTTP clients);
- returns the handler's value as JSON text plus `structuredContent` (when it is a JSON object), and turns a
  `ToolInputError` or a schema violation into an error result the caller can read.
We use the low-level server rather than `MCPServer` because that one lists all tools in one page and checks
arguments against a signature-derived pydantic model instead of the schema it advertises.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from registry.model import Tool

PAGE_SIZE = 100


class ToolInputError(ValueError):
    """Arguments that pass the schema but still cannot be served (e.g. division by zero, unknown note id)."""


@dataclass
class Handler:
    tool: Tool
    fn: Callable[..., Any]  # called with the arguments as keyword arguments (or as one dict, see `pass_dict`)
    pass_dict: bool = False
    takes: frozenset[str] | None = field(init=False, repr=False)  # the keys `fn` accepts; None: any

    def __post_init__(self):
        self.takes = None if self.pass_dict else keyword_names(self.fn)


def keyword_names(fn: Callable) -> frozenset[str] | None:
    """The names `fn` can take as keyword arguments; None when it takes any (**kwargs) or has no signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def handlers_from_functions(functions: list[Callable]) -> list[Handler]:
    """Handlers for functions decorated with `registry.decorator.tool`."""
    return [Handler(tool=f.tool, fn=f) for f in functions]


def call_handler(handler: Handler, arguments: dict[str, Any] | None) -> tuple[Any, str | None]:
    """Validate and run one call. Returns (value, None) or (None, error message)."""
    from registry.model import arguments_error

    arguments = arguments or {}
    name = handler.tool.name
    error = arguments_error(name, handler.tool.input_schema, arguments)
    if error is not None:
        return None, error
    unknown = sorted(set(arguments) - handler.takes) if handler.takes is not None else []
    if unknown:  # an open schema let a key through that the function cannot take: refuse it, never a TypeError
        takes = ", ".join(sorted(handler.takes)) or "no arguments"
        return None, (f"invalid arguments for {name}: $.arguments: unknown key{'s' if len(unknown) > 1 else ''} "
                      f"{', '.join(map(repr, unknown))}; {name} takes {takes}")
    try:
        value = handler.fn(arguments) if handler.pass_dict else handler.fn(**arguments)
    except ToolInputError as e:
        return None, f"{name}: {e}"
    return value, None


def build_server(name: str, handlers: list[Handler], page_size: int = PAGE_SIZE):
    """The SDK `Server` serving `handlers` (see the module docstring)."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    by_name = {h.tool.name: h for h in handlers}
    listed = [types.Tool.model_validate(h.tool.to_mcp()) for h in handlers]

    async def list_tools(ctx, params) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        start = int(cursor) if cursor and cursor.isdigit() else 0
        end = start + page_size
        return types.ListToolsResult(tools=listed[start:end], next_cursor=str(end) if end < len(listed) else None)

    async def call_tool(ctx, params) -> types.CallToolResult:
        handler = by_name.get(params.name)
        if handler is None:
            value, error = None, f"unknown tool {params.name!r}; list the tools to see what this server offers"
        else:
            # in a worker thread: a slow tool must not stall the server (pings, other HTTP clients and calls)
            value, error = await anyio.to_thread.run_sync(call_handler, handler, params.arguments)
        if error is not None:
            return types.CallToolResult(content=[types.TextContent(type="text", text=error)], is_error=True)
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
        structured = value if isinstance(value, dict) else None
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)

    return Server(name, version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool)


def add_transport_arguments(parser) -> None:
    """The transport options every bundled server takes (see the module docstring)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--http", action="store_true", help="serve streamable HTTP at http://HOST:PORT/mcp")
    group.add_argument("--sse", action="store_true", help="serve the legacy SSE transport at http://HOST:PORT/sse")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one, printed on stderr)")
    parser.add_argument("--bearer", metavar="TOKEN", default=None,
                        help="HTTP only: refuse requests without the header `Authorization: Bearer TOKEN`")


def serve(name: str, handlers: list[Handler], page_size: int = PAGE_SIZE, args=None) -> None:
    """Serve until the client closes stdin (stdio) or the process is stopped (HTTP). `args`: parsed options of
    `add_transport_arguments`; None parses them from the command line."""
    import anyio

    if args is None:
        import argparse

        parser = argparse.ArgumentParser(description=f"the bundled {name} MCP server")
        add_transport_arguments(parser)
        args = parser.parse_args()
    server = build_server(name, handlers, page_size)
    if getattr(args, "http", False) or getattr(args, "sse", False):
        serve_http(server, "sse" if args.sse else "http", args.host, args.port, args.bearer)
        return
    from mcp.server.stdio import stdio_server

    async def main():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def http_app(server, transport: str = "http", host: str = "127.0.0.1", bearer: str | None = None):
    """The Starlette app serving the SDK `server` over streamable HTTP (`/mcp`) or SSE (`/sse` + `/messages/`)."""
    if transport == "http":
        app = server.streamable_http_app(host=host)
    else:
        from mcp.server.sse import SseServerTransport
        from mcp.server.transport_security import TransportSecuritySettings
        from starlette.applications import Starlette
        from starlette.responses import Response
        from starlette.routing import Mount, Route

        local = TransportSecuritySettings(allowed_hosts=["127.0.0.1:*", "localhost:*"],
                                          allowed_origins=["http://127.0.0.1:*", "http://localhost:*"])
        sse = SseServerTransport("/messages/", security_settings=local if host in ("127.0.0.1", "localhost") else None)

        async def stream(request):
            async with sse.connect_sse(request.scope, request.receive, request._send) as (read, write):
                await server.run(read, write, server.create_initialization_options())
            return Response()

        app = Starlette(routes=[Route("/sse", endpoint=stream, methods=["GET"]),
                                Mount("/messages/", app=sse.handle_post_message)])
    return app if bearer is None else _require_bearer(app, bearer)


def _require_bearer(app, token: str):
    """`app` refusing HTTP requests whose Authorization header is not `Bearer <token>` (401)."""
    from starlette.responses import PlainTextResponse

    expected = f"Bearer {token}".encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await PlainTextResponse("missing or wrong bearer token", status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


def serve_http(server, transport: str, host: str, port: int, bearer: str | None = None) -> None:
    """Serve `server` over HTTP on host:port (0: a free port) until stopped; prints `serving <url>` on stderr
    once the socket listens, so a parent process knows where to connect."""
    import socket
    import sys

    import anyio
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(http_app(server, transport, host, bearer), log_level="warning", lifespan="on")
    path = "/mcp" if transport == "http" else "/sse"
    print(f"serving http://{host}:{port}{path}", file=sys.stderr, flush=True)
    anyio.run(uvicorn.Server(config).serve, [sock])
