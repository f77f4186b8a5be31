"""Where tools come from: an MCP server (stdio or remote), a JSON/JSONL file, or decorated Python functions.
(MCP client config files, which name many servers, are read by registry.mcp_config.)

Each source ends in `RegistryStore.add_tools`, which validates every tool and keeps the good ones of a batch.
A source that fails as a whole (a server that exits or never answers, an unreadable file) raises before the
store is touched, so nothing already registered is lost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from registry.client import DEFAULT_TIMEOUT_S, ServerCommand, list_server_tools
from registry.model import NAME_PATTERN, ToolValidationError, check_name, safe_name
from registry.records import RegisterReport
from registry.store import RegistryStore
from registry.transports import RemoteServer, ServerSpec


def register_server(
    command: str, store: RegistryStore, timeout_s: float = DEFAULT_TIMEOUT_S, name: str | None = None,
    cwd: str | None = None, env: dict[str, str] | None = None,
) -> RegisterReport:
    """Start `command` (a shell-style line) as an MCP stdio server, list all its tools (paginated), store them
    under the server's name (its handshake name unless `name` is given) and record how to start it again.

    Tools the server no longer lists are removed; changed ones get a new version. Raises ServerError if the
    server cannot be started or does not answer within `timeout_s` seconds (nothing is written then). `env`:
    variables the server starts with (values may hold `${VAR}`, resolved at each start and stored as written).
    """
    return register_spec(ServerCommand.parse(command, cwd=cwd or os.getcwd(), env=env), store, timeout_s, name)


def register_remote(url: str, store: RegistryStore, transport: str = "http", headers: dict[str, str] | None = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S, name: str | None = None) -> RegisterReport:
    """As `register_server`, for a server at `url` over streamable HTTP (`transport="http"`) or SSE."""
    return register_spec(RemoteServer(url, transport, dict(headers or {})), store, timeout_s, name)


def register_spec(spec: ServerSpec, store: RegistryStore, timeout_s: float = DEFAULT_TIMEOUT_S,
                  name: str | None = None) -> RegisterReport:
    """Connect to the server `spec` describes, list its tools and store them and the spec (see register_server)."""
    server_name, tools = list_server_tools(spec, timeout_s)
    server_name = name or safe_name(server_name or "")  # the name the server reports, made one (a name given is kept)
    try:
        check_name(server_name)
    except ToolValidationError:
        raise ValueError(
            f"server name {server_name!r} is not a safe identifier ({NAME_PATTERN}); pass --name NAME"
        ) from None
    store.upsert_server(server_name, **spec.record())
    return store.add_tools(tools, server=server_name, prune=True)


def load_tool_file(path: str | Path) -> list[dict[str, Any]]:
    """Tool dicts from a `.jsonl` file (one tool per line; blank lines skipped) or a `.json` file holding one
    tool, a list of tools, or `{"tools": [...]}` (the MCP `tools/list` result). Raises ValueError naming the
    file and line of malformed JSON; tools themselves are validated later, one by one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tool file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        items = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        return items
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        return data["tools"]
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        return [data]
    raise ValueError(f"{path}: expected a tool object, a list of tools or {{\"tools\": [...]}}")


def register_file(path: str | Path, store: RegistryStore) -> RegisterReport:
    """Register every tool of a JSON/JSONL file (see `load_tool_file`); they belong to no server."""
    return store.add_tools(load_tool_file(path))


def register_functions(functions: list[Callable], store: RegistryStore) -> RegisterReport:
    """Register functions decorated with `registry.decorator.tool`."""
    missing = [getattr(f, "__name__", repr(f)) for f in functions if not hasattr(f, "tool")]
    if missing:
        raise ValueError(f"not decorated with @registry.decorator.tool: {', '.join(missing)}")
    return store.add_tools([f.tool for f in functions])
