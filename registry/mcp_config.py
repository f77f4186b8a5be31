"""MCP client config files as a registration source: `nexus register --config PATH`.

Reads the `mcpServers` object of Claude Desktop (claude_desktop_config.json), Cursor (.cursor/mcp.json),
Claude Code (.mcp.json) and Cline, and the `servers` object of VS Code (.vscode/mcp.json). Each entry is
- stdio: `command`, `args`, `env`, `cwd` (`type` absent or "stdio"), or
- remote: `url` with `type` "http" / "streamableHttp" / "streamable-http" (streamable HTTP, the default for a
  `url`) or "sse" (legacy), and `headers`.
Strings expand `${VAR}`, `${env:VAR}`, `${VAR:-default}`, `${workspaceFolder}` and `${userHome}`
(registry.variables); `env` and `headers` values keep their environment references unexpanded in the registry.
An entry with `"disabled": true` is skipped. A bad entry is reported by name with a one-line reason and the
others still register; the config key is the server's registered name.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.client import DEFAULT_TIMEOUT_S, ServerError
from registry.model import NAME_PATTERN, ToolValidationError, check_name, safe_name
from registry.records import RegisterReport
from registry.store import RegistryStore
from registry.transports import RemoteServer, ServerCommand, ServerSpec
from registry.variables import expand

REMOTE_TYPES = {"http": "http", "streamablehttp": "http", "streamable-http": "http", "sse": "sse"}


@dataclass
class ConfigEntry:
    """One server of a config file: its spec, or why it is skipped (`disabled`) or broken (`error`)."""

    name: str
    spec: ServerSpec | None = None
    disabled: bool = False
    error: str | None = None

    @property
    def transport(self) -> str:
        return self.spec.transport if self.spec is not None else "-"


@dataclass
class ConfigOutcome:
    """What registering one entry did. status: registered | disabled | failed; detail: the tool counts, or the
    reason (for a server that failed, its ServerError in full: the first line, then its last stderr lines)."""

    name: str
    transport: str
    status: str
    detail: str = ""
    tools: int = 0
    report: RegisterReport | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"server": self.name, "transport": self.transport, "status": self.status, "tools": self.tools,
                "detail": self.detail, "report": self.report.as_dict() if self.report else None}


def read_config(path: str | Path, environ=None) -> list[ConfigEntry]:
    """The entries of an MCP client config file, in file order. Raises ValueError (naming the file) only when
    the file as a whole is unusable; a bad entry comes back with its `error` set."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    servers = data.get("mcpServers", data.get("servers")) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f"{path}: no `mcpServers` (Claude Desktop, Cursor, Claude Code, Cline) or `servers` "
                         "(VS Code) object of servers")
    folder = path.resolve().parent
    workspace = folder.parent if folder.name == ".vscode" else folder
    named = {"workspaceFolder": str(workspace), "userHome": str(Path.home())}
    return [_entry(str(name), raw, named, str(workspace), environ) for name, raw in servers.items()]


def _entry(name: str, raw: Any, named: dict, default_cwd: str, environ) -> ConfigEntry:
    name = safe_name(name) or name  # a key such as "Basic Memory" names the server Basic-Memory
    try:
        check_name(name)
    except ToolValidationError:
        return ConfigEntry(name, error=f"server name is not a safe identifier ({NAME_PATTERN}); rename the key")
    if not isinstance(raw, dict):
        return ConfigEntry(name, error="entry is not a JSON object")
    if raw.get("disabled") is True:
        return ConfigEntry(name, disabled=True)
    try:
        return ConfigEntry(name, spec=_spec(name, raw, named, default_cwd, environ))
    except ValueError as e:
        return ConfigEntry(name, error=str(e))


def _spec(name: str, raw: dict, named: dict, default_cwd: str, environ) -> ServerSpec:
    where = f"server {name!r}"

    def text(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: `{key}` must be a string, not {type(value).__name__}")
        return expand(value, f"{where}: {key}", named, environ)

    def strings(key: str) -> dict[str, str]:  # env / headers: environment references stay as written
        value = raw.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ValueError(f"{where}: `{key}` must be an object of strings")
        return {k: expand(v, f"{where}: {key}.{k}", named, environ, keep_env=True) for k, v in value.items()}

    kind = raw.get("type")
    remote = REMOTE_TYPES.get(kind.lower()) if isinstance(kind, str) else None
    if kind not in (None, "stdio") and remote is None:
        raise ValueError(f"{where}: unknown type {kind!r}; use stdio, http, streamableHttp, streamable-http or sse")
    if remote is not None or (kind is None and "url" in raw):
        if "url" not in raw:
            raise ValueError(f"{where}: type {kind!r} needs a `url`")
        return RemoteServer(text("url", raw["url"]), remote or "http", strings("headers"))
    if not raw.get("command"):
        raise ValueError(f"{where}: no `command` (stdio) or `url` (remote server)")
    args = raw.get("args") or []
    if not isinstance(args, list):
        raise ValueError(f"{where}: `args` must be a list of strings")
    argv = [text("command", raw["command"]), *(text(f"args[{i}]", a) for i, a in enumerate(args))]
    cwd = text("cwd", raw["cwd"]) if raw.get("cwd") else default_cwd
    return ServerCommand.parse(shlex.join(argv), cwd, strings("env"))  # a bare `python` is this interpreter


def register_config(path: str | Path, store: RegistryStore, timeout_s: float = DEFAULT_TIMEOUT_S,
                    environ=None) -> list[ConfigOutcome]:
    """Register every enabled, well-formed server of the config file at `path` under its config key; returns
    one outcome per entry. A server that fails to start or list its tools is a failed outcome (nothing of it
    is written) and does not stop the others."""
    from registry.sources import register_spec

    out = []
    for entry in read_config(path, environ):
        if entry.disabled:
            out.append(ConfigOutcome(entry.name, "-", "disabled", "\"disabled\": true in the config"))
            continue
        if entry.error:
            out.append(ConfigOutcome(entry.name, "-", "failed", entry.error))
            continue
        try:
            report = register_spec(entry.spec, store, timeout_s, name=entry.name)
        except (ServerError, ValueError) as e:
            out.append(ConfigOutcome(entry.name, entry.transport, "failed", str(e)))
            continue
        counts = f"{len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged"
        if report.rejected:
            counts += f", {len(report.rejected)} rejected ({report.rejected[0]})"
        if report.renamed:
            counts += f", {len(report.renamed)} renamed ({', '.join(q for _, q, _ in report.renamed[:3])}" + \
                      (", ..." if len(report.renamed) > 3 else "") + ": another server has the name)"
        n = len(report.added) + len(report.updated) + len(report.unchanged)
        out.append(ConfigOutcome(entry.name, entry.transport, "registered", counts, n, report))
    return out
