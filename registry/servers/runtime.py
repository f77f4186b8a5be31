"""The shared runtime of the bundled MCP servers, on the `mcp` SDK's low-level `Server` over stdio.

A server is a name plus a list of `Handler`s (a validated `Tool` and a Python callable). The runtime
- answers `tools/list` in pages of `page_size` tools with a `nextCursor` (large catalogues need pagination);
- validates each call's arguments against the tool's own input schema with `jsonschema` before the handler
  runs, so a handler only ever sees arguments its schema allows;
- returns the handler's value as JSON text plus `structuredContent` (when it is a JSON object), and turns a
  `ToolInputError` or a schema violation into an error result the caller can read.
We use the low-level server rather than `MCPServer` because that one lists all tools in one page and checks
arguments against a signature-derived pydantic model instead of the schema it advertises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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


def handlers_from_functions(functions: list[Callable]) -> list[Handler]:
    """Handlers for functions decorated with `registry.decorator.tool`."""
    return [Handler(tool=f.tool, fn=f) for f in functions]


def call_handler(handler: Handler, arguments: dict[str, Any] | None) -> tuple[Any, str | None]:
    """Validate and run one call. Returns (value, None) or (None, error message)."""
    from jsonschema import validators
    from jsonschema.exceptions import best_match

    from registry.model import json_path

    arguments = arguments or {}
    schema = handler.tool.input_schema
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    error = best_match(cls(schema).iter_errors(arguments))
    if error is not None:
        where = json_path(["arguments", *error.absolute_path])
        return None, f"invalid arguments for {handler.tool.name}: {where}: {error.message}"
    try:
        value = handler.fn(arguments) if handler.pass_dict else handler.fn(**arguments)
    except ToolInputError as e:
        return None, f"{handler.tool.name}: {e}"
    return value, None


def build_server(name: str, handlers: list[Handler], page_size: int = PAGE_SIZE):
    """The SDK `Server` serving `handlers` (see the module docstring)."""
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
            value, error = call_handler(handler, params.arguments)
        if error is not None:
            return types.CallToolResult(content=[types.TextContent(type="text", text=error)], is_error=True)
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
        structured = value if isinstance(value, dict) else None
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)

    return Server(name, version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool)


def serve(name: str, handlers: list[Handler], page_size: int = PAGE_SIZE) -> None:
    """Serve over stdio until the client closes stdin."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(name, handlers, page_size)

    async def main():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
