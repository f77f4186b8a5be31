"""How to reach an MCP server: a stdio command (`ServerCommand`) or a remote URL (`RemoteServer`: streamable
HTTP, or the legacy SSE transport). Each spec opens its own transport with `connect()`, so `ToolClient` never
asks which kind it holds; `ServerSpec` is either.

A stdio server's `env` values and a remote server's `headers` may hold `${VAR}` references (registry.variables):
they are stored as written, so a token referenced that way never lands in the registry file, and resolved from
the environment each time the server is started or connected to.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import shutil
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Union
from urllib.parse import urlparse

from registry.variables import expand_values

PASSED_ENV = ("PYTHONPATH", "NEXUS_HOME", "VIRTUAL_ENV", "TMPDIR")
TRANSPORTS = ("stdio", "http", "sse")  # as stored in the registry's `servers.transport`
SSE_READ_TIMEOUT_S = 300.0  # an open response stream may be quiet this long (the call timeout still applies)


class _NotJsonRpc(logging.Filter):
    """The MCP SDK logs a traceback for each line a stdio server writes to stdout that is not JSON-RPC (a banner, a
    stray print) and goes on without it: one warning naming the line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Failed to parse JSONRPC message"):
            error = record.exc_info[1]
            errors = error.errors() if hasattr(error, "errors") else [{}]
            line = str((errors[0] if errors else {}).get("input", error))
            record.msg, record.args = "an MCP server wrote a line to stdout that is not JSON-RPC (ignored): %r", (
                line[:200],)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


logging.getLogger("mcp.client.stdio").addFilter(_NotJsonRpc())


def _python(name: str, args: list[str], path: str | None) -> str:
    """The interpreter a bare `python` in a server command means (`ServerCommand.parse`)."""
    module = args[1] if len(args) > 1 and args[0] == "-m" else None
    if module is None or importlib.util.find_spec(module.split(".")[0]) is not None:
        return sys.executable
    return shutil.which(name, path=path) or sys.executable


@dataclass
class ServerCommand:
    """How to start a stdio server: argv, working folder, extra environment variables (on top of the SDK's
    default environment and this process's PASSED_ENV variables, read when the server starts)."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    line: str | None = None  # the command line as the user wrote it (recorded in the registry); None: from argv
    transport = "stdio"

    @classmethod
    def parse(cls, command: str, cwd: str | None = None, env: dict[str, str] | None = None) -> "ServerCommand":
        """From a shell-style command line. A bare `python`/`python3` is this interpreter (bundled servers run in
        Nexus's environment), except for `python -m MODULE` where this interpreter has no MODULE and the
        `python` on PATH is another: that one, as an MCP client would start it (a server installed in its own
        virtualenv, its `bin` on PATH)."""
        argv = shlex.split(command)
        if not argv:
            raise ValueError("empty server command; pass e.g. --server 'python -m registry.servers.calculator'")
        if argv[0] in ("python", "python3"):
            path = (env or {}).get("PATH")
            argv[0] = _python(argv[0], argv[1:], path if path and "${" not in path else None)
        return cls(argv=argv, cwd=cwd, env=dict(env or {}), line=command)

    @property
    def command(self) -> str:
        return self.line or shlex.join(self.argv)

    def record(self) -> dict:
        """The registry's `upsert_server` arguments for this server."""
        return {"command": self.command, "cwd": self.cwd, "env": self.env}

    def describe(self) -> str:
        return f"`{shlex.join(self.argv)}`"

    def connect(self, errlog):
        """The SDK's stdio transport: an async context manager yielding (read, write) streams."""
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        passed = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        params = StdioServerParameters(command=self.argv[0], args=self.argv[1:], cwd=self.cwd,
                                       env=passed | expand_values(self.env, "env"))
        return stdio_client(params, errlog=errlog)


@dataclass
class RemoteServer:
    """A server reached over HTTP: `transport` "http" (streamable HTTP) or "sse" (legacy), sent `headers`."""

    url: str
    transport: str = "http"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 20.0  # HTTP connect/write timeout; ToolClient sets it to its own

    def __post_init__(self):
        if self.transport not in ("http", "sse"):
            raise ValueError(f"unknown remote transport {self.transport!r}; use http (streamable HTTP) or sse")
        parsed = urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"server URL {self.url!r} is not an http(s):// URL")
        bad = [k for k, v in self.headers.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ValueError(f"header values must be strings: {bad[:3]}")

    def record(self) -> dict:
        """The registry's `upsert_server` arguments for this server."""
        return {"transport": self.transport, "url": self.url, "headers": self.headers}

    def describe(self) -> str:
        return f"{self.url} ({'streamable HTTP' if self.transport == 'http' else 'SSE'})"

    def connect(self, errlog=None):
        """The SDK's streamable-HTTP or SSE client transport, yielding (read, write) streams."""
        headers = expand_values(self.headers, "headers")
        if self.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(self.url, headers=headers, timeout=self.timeout_s, sse_read_timeout=SSE_READ_TIMEOUT_S)
        return _streamable_http(self.url, headers, self.timeout_s)


@asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str], timeout_s: float):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    # the SDK's advice: headers and timeouts go on our own httpx2 client (it stays ours to close)
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout_s, read=SSE_READ_TIMEOUT_S)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


ServerSpec = Union[ServerCommand, RemoteServer]


def spec_from_record(transport: str, command: str, cwd: str | None, url: str | None,
                     headers: dict[str, str] | None, env: dict[str, str] | None) -> ServerSpec:
    """The spec a registry row describes (`servers` columns)."""
    if transport == "stdio":
        return ServerCommand.parse(command, cwd, env)
    if url is None:
        raise ValueError(f"registered {transport} server has no URL; register it again with --url")
    return RemoteServer(url, transport, dict(headers or {}))
