"""What the registry store returns: a registration's outcome (`RegisterReport`) and a registered server
(`ServerRecord`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from registry.model import ToolValidationError


@dataclass
class RegisterReport:
    """What one registration did: tool names per outcome, and the rejected tools with their errors."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)  # schema changed: version bumped, artefacts stale
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # gone from the server's listing (prune=True only)
    rejected: list[ToolValidationError] = field(default_factory=list)
    server: str | None = None
    renamed: list[tuple[str, str, str | None]] = field(default_factory=list)  # (name, registered as, its owner)

    @property
    def ok(self) -> bool:
        return not self.rejected

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "rejected": [e.as_dict() for e in self.rejected],
            "renamed": [{"name": n, "registered_as": q, "owner": o} for n, q, o in self.renamed],
        }


@dataclass
class ServerRecord:
    """A registered server: its name, how to reach it (transport stdio: the shell command that starts it, the
    folder to start it in, extra environment variables; http / sse: its URL and the headers sent), its tool count."""

    name: str
    command: str
    cwd: str | None
    tool_count: int
    registered_at: float
    updated_at: float
    transport: str = "stdio"
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def spec(self):
        """The registry.transports spec that reaches this server (ServerCommand or RemoteServer)."""
        from registry.transports import spec_from_record

        return spec_from_record(self.transport, self.command, self.cwd, self.url, self.headers, self.env)

    @property
    def target(self) -> str:
        """The command line or the URL, for listings."""
        return self.command if self.transport == "stdio" else self.url or ""
