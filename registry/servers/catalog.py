"""Catalogue MCP server: serves a large tool catalogue (JSONL of MCP tools) with deterministic answers.

`--catalog FILE` (required): a JSON/JSONL file of MCP tools.
Each call is validated against the tool's schema; the answer echoes the tool name and arguments with a
`call_id` (sha256 of the canonical arguments, 16 hex digits), so the same call always gives the same result.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from registry.model import Tool, ToolValidationError, canonical_json, check_name
from registry.servers.runtime import PAGE_SIZE, Handler, add_transport_arguments, serve


def answer(tool_name: str):
    def run(arguments: dict) -> dict:
        digest = hashlib.sha256(canonical_json({"tool": tool_name, "arguments": arguments}).encode()).hexdigest()
        return {"tool": tool_name, "arguments": arguments, "call_id": digest[:16], "status": "ok"}

    return run


def load_handlers(path: Path, limit: int | None = None) -> list[Handler]:
    """Handlers for the catalogue's tools. Names are checked here (bad ones are reported on stderr and
    skipped); the full meta-schema check is left to the registering client, which does it anyway, so that a
    catalogue of thousands of tools starts fast. Call arguments are still validated against each tool's
    schema by the runtime."""
    from registry.sources import load_tool_file

    handlers = []
    for item in load_tool_file(path)[:limit]:
        try:
            check_name(item.get("name"))
            if not isinstance(item.get("inputSchema"), dict):
                raise ToolValidationError(item["name"], "$.inputSchema", "schema-is-object", "must be an object")
        except ToolValidationError as e:
            print(f"catalog: skipping {e}", file=sys.stderr)
            continue
        tool = Tool.model_construct(
            name=item["name"], title=item.get("title"), description=item.get("description") or "",
            input_schema=item["inputSchema"], output_schema=item.get("outputSchema"),
            annotations=item.get("annotations"), server=None, schema_hash="",
        )
        handlers.append(Handler(tool=tool, fn=answer(tool.name), pass_dict=True))
    return handlers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", type=Path, required=True, help="JSON/JSONL file of MCP tools")
    parser.add_argument("--limit", type=int, default=None, help="serve only the first N tools")
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE, help="tools per tools/list page")
    add_transport_arguments(parser)
    args = parser.parse_args(argv)
    if not args.catalog.is_file():
        parser.error(f"catalogue {args.catalog} not found; pass --catalog FILE (JSONL, one MCP tool per line)")
    serve("catalog", load_handlers(args.catalog, args.limit), page_size=args.page_size, args=args)


if __name__ == "__main__":
    main()
