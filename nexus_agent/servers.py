"""MCP servers for the agent: started (stdio) or connected to (remote) lazily, kept alive across turns,
restarted or reconnected once after a crash or a dropped connection.

Every call returns an `Observation` (never raises for a tool or server failure), so one broken tool cannot
end the session: the model reads what went wrong instead.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from registry.client import ServerCommand, ServerError, ServerSpec, SyncToolClient

# words of a result that reports a failure: many servers answer a failed call as a plain result, not a tool error
FAILURE_WORDS = re.compile(r"\b(errors?|failed|failure|exception|traceback|invalid)\b", re.IGNORECASE)


@dataclass
class Observation:
    """A tool call's outcome as the model will see it. status: ok | tool_error | timeout | server_error |
    invalid_arguments | no_server; text: the result or a clear error; restarted: the server was restarted."""

    tool: str
    status: str
    text: str
    result: Any = None
    elapsed_ms: float = 0.0
    restarted: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def confirmed(self) -> bool:
        """ok, and the result's first words report no failure (the time server's "Error converting time: ...",
        the SQLite server's "Database error: no such table", `{"status": "error", ...}` all come back ok). Only a
        confirmed call teaches the router (`slb.learn`): "What is the capital of Australia?" called
        `convert_time` once, came back ok with an error text, and was learned as its example."""
        return self.ok and not FAILURE_WORDS.search(self.text[:80])

    def as_dict(self) -> dict:
        return {"tool": self.tool, "status": self.status, "text": self.text, "elapsed_ms": self.elapsed_ms,
                "restarted": self.restarted}


@dataclass
class ServerPoolConfig:
    """call_timeout_s: a call that takes longer is abandoned (and its server restarted on the next call);
    start_timeout_s: seconds to start a server; max_restarts: restarts after consecutive failures of one server
    (an answered call resets the count); max_result_chars: longer result text is cut for the model (with a note
    saying how much was cut; `Observation.result` keeps the whole structured result)."""

    call_timeout_s: float = 20.0
    start_timeout_s: float = 20.0
    max_restarts: int = 1
    max_result_chars: int = 16_000

    def __post_init__(self):
        if self.call_timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("server timeouts must be > 0 seconds")
        if self.max_result_chars < 1:
            raise ValueError(f"max_result_chars must be >= 1, got {self.max_result_chars}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")


@dataclass
class _Server:
    command: ServerSpec
    client: SyncToolClient | None = None
    restarts: int = 0
    starts: int = 0
    broken: bool = False  # last call timed out or crashed: restart before the next call


class ServerPool:
    """Servers by name (`commands`: name -> ServerCommand, RemoteServer or a stdio command line), and which
    server serves a tool. A remote server is "restarted" by opening a new connection and MCP session to it."""

    def __init__(self, commands: dict[str, ServerSpec | str], tool_server: dict[str, str],
                 config: ServerPoolConfig | None = None, remote_names: dict[str, str] | None = None):
        self.config = config or ServerPoolConfig()
        self.tool_server = dict(tool_server)
        self.remote_names = dict(remote_names or {})  # a tool registered as `server.name` -> its name there
        self._servers = {n: _Server(ServerCommand.parse(c) if isinstance(c, str) else c) for n, c in commands.items()}

    @classmethod
    def from_store(cls, store, config: ServerPoolConfig | None = None) -> "ServerPool":
        """Every registered server of a `RegistryStore` and the tools it serves."""
        commands = {s.name: s.spec() for s in store.list_servers()}
        tools = [t for t in store.list_tools() if t.server]
        return cls(commands, {t.name: t.server for t in tools}, config,
                   {t.name: t.server_name for t in tools if t.remote_name})

    def running(self) -> list[str]:
        return [n for n, s in self._servers.items() if s.client is not None]

    def starts(self, server: str) -> int:
        return self._servers[server].starts

    def _start(self, srv: _Server) -> None:
        srv.client = SyncToolClient(srv.command, self.config.start_timeout_s)
        srv.starts += 1
        srv.broken = False

    def _stop(self, srv: _Server) -> None:
        client, srv.client = srv.client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass  # the server process is already gone

    def call(self, tool: str, arguments: dict[str, Any]) -> Observation:
        """Call `tool` on its server: start it if needed, restart it once after a crash or a hang."""
        t0 = time.perf_counter()
        name = self.tool_server.get(tool)
        if name not in self._servers:
            return Observation(tool, "no_server", f"no registered server provides tool {tool!r}; "
                               "register it with `nexus register --server CMD`")
        srv = self._servers[name]
        restarted = False
        for attempt in range(2):
            try:
                if srv.client is None or srv.broken:
                    if srv.client is not None or srv.starts:
                        if srv.restarts >= self.config.max_restarts:
                            self._stop(srv)
                            return Observation(tool, "server_error", f"server {name!r} failed and was already "
                                               f"restarted {srv.restarts} time(s); not retrying", elapsed_ms=_ms(t0))
                        srv.restarts += 1
                        restarted = True
                    self._stop(srv)
                    self._start(srv)
                res = srv.client.call_tool(self.remote_names.get(tool, tool), arguments, self.config.call_timeout_s)
            except ServerError as e:
                srv.broken = True
                if "no answer within" in str(e):  # hung: keep the session going, restart before the next call
                    return Observation(tool, "timeout", f"tool {tool!r} did not answer within "
                                       f"{self.config.call_timeout_s:g} s; the call was abandoned",
                                       elapsed_ms=_ms(t0), restarted=restarted)
                if attempt == 0 and srv.restarts < self.config.max_restarts:
                    continue  # crashed: restart once and retry the same call
                return Observation(tool, "server_error", f"server {name!r} failed: {e.brief()[:300]}",
                                   elapsed_ms=_ms(t0), restarted=restarted)
            srv.restarts = 0  # the server answered: a later failure gets its own restart
            status = "tool_error" if res.is_error else "ok"
            text = _cap(res.text if res.text else json.dumps(res.structured), self.config.max_result_chars)
            return Observation(tool, status, text, res.structured, _ms(t0), restarted)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop every running server (idempotent)."""
        for srv in self._servers.values():
            self._stop(srv)

    def __enter__(self) -> "ServerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def _cap(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with a note, so one huge result cannot flood the model's context."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[result truncated: showing {limit} of {len(text)} characters]"

