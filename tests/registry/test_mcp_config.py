"""`nexus register --config`: a Claude Desktop config (stdio, remote, disabled, `${VAR}` and broken entries) and
a VS Code `servers` file, against real bundled servers over stdio and streamable HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.mcp_config import read_config, register_config
from registry.transports import RemoteServer, ServerCommand

REPO = Path(__file__).resolve().parents[2]


def nexus(*args: str, home: Path, env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nexus_agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(os.environ, NEXUS_HOME=str(home), **(env or {})))


def test_claude_desktop_config(nexus_home, tmp_path, http_server):
    units = http_server("registry.servers.units")
    config = tmp_path / "claude_desktop_config.json"
    config.write_text(json.dumps({"globalShortcut": "", "mcpServers": {
        "calc": {"command": "python", "args": ["-m", "registry.servers.calculator"], "cwd": str(REPO)},
        "units-remote": {"type": "streamableHttp", "url": units.url},
        "clock-off": {"command": "python", "args": ["-m", "registry.servers.clock"], "disabled": True},
        "notes": {"command": "python", "args": ["-m", "registry.servers.notes", "--db", "${NOTES_DIR}/n.sqlite"],
                  "cwd": str(REPO), "env": {"NOTES_TAG": "${env:NOTES_DIR}"}},
        "broken": {"args": ["-m", "registry.servers.clock"]},
    }}))
    r = nexus("register", "--config", str(config), home=nexus_home, env={"NOTES_DIR": str(tmp_path), "COLUMNS": "200"})
    assert r.returncode == 3, r.stdout + r.stderr  # some failed, the others registered
    assert "broken: server 'broken': no `command` (stdio) or `url` (remote server)" in r.stderr
    assert "3 registered, 1 failed, 1 disabled" in r.stdout and "disabled" in r.stdout
    servers = {s["name"]: s for s in json.loads(nexus("servers", "list", "--json", home=nexus_home).stdout)}
    assert sorted(servers) == ["calc", "notes", "units-remote"]
    assert servers["units-remote"]["transport"] == "http" and servers["units-remote"]["url"] == units.url
    assert servers["calc"]["tool_count"] == 4 and servers["notes"]["tool_count"] == 4
    assert f"--db {tmp_path}/n.sqlite" in servers["notes"]["command"]  # args are expanded when read
    assert servers["notes"]["env"] == {"NOTES_TAG": "${env:NOTES_DIR}"}  # env values are kept as written
    assert (tmp_path / "n.sqlite").exists()

    as_json = json.loads(nexus("register", "--config", str(config), "--json", home=nexus_home,
                               env={"NOTES_DIR": str(tmp_path)}).stdout)
    status = {s["server"]: (s["status"], s["transport"], s["tools"]) for s in as_json["servers"]}
    assert status == {"calc": ("registered", "stdio", 4), "units-remote": ("registered", "http", 2),
                      "clock-off": ("disabled", "-", 0), "notes": ("registered", "stdio", 4),
                      "broken": ("failed", "-", 0)}

    unset = {e.name: e for e in read_config(config, environ={})}  # NOTES_DIR not set this time
    assert unset["notes"].error == "server 'notes': args[3]: environment variable NOTES_DIR is not set " \
        "(referenced as ${NOTES_DIR})"


def test_vscode_servers_file(store, tmp_path, http_server):
    calc = http_server("registry.servers.calculator")
    workspace = tmp_path / "project"
    (workspace / ".vscode").mkdir(parents=True)
    (workspace / "tools.jsonl").write_text("")
    config = workspace / ".vscode" / "mcp.json"
    config.write_text(json.dumps({"inputs": [], "servers": {
        "calc-http": {"type": "http", "url": calc.url, "headers": {"X-Client": "nexus"}},
        "units": {"type": "stdio", "command": "python", "args": ["-m", "registry.servers.units"],
                  "env": {"PYTHONPATH": str(REPO)}},
        "files": {"type": "stdio", "command": "python",
                  "args": ["-m", "registry.servers.files", "--root", "${workspaceFolder}/sandbox"],
                  "env": {"PYTHONPATH": str(REPO)}},
    }}))
    outcomes = {o.name: o for o in register_config(config, store, timeout_s=30)}
    assert {n: o.status for n, o in outcomes.items()} == dict.fromkeys(("calc-http", "units", "files"), "registered")
    assert outcomes["calc-http"].tools == 4 and outcomes["calc-http"].transport == "http"
    rec = {s.name: s for s in store.list_servers()}
    assert rec["files"].cwd == str(workspace) and (workspace / "sandbox").is_dir()
    assert rec["calc-http"].headers == {"X-Client": "nexus"}


def test_entry_errors_name_the_entry(tmp_path):
    config = tmp_path / ".mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "ws": {"type": "websocket", "url": "ws://x"},
        "no-url": {"type": "sse"},
        "undefined": {"url": "https://${NEXUS_TEST_UNSET_HOST}/mcp"},
        "prompted": {"url": "https://example.test/mcp", "headers": {"Authorization": "${input:token}"}},
        "Basic Memory!": {"command": "x"},
        "!!!": {"command": "x"},
        "defaulted": {"url": "https://${NEXUS_TEST_UNSET_HOST:-example.test}/mcp", "type": "streamable-http"},
        "legacy": {"url": "http://127.0.0.1:1/sse", "type": "sse", "headers": {"K": "${env:HOME}"}},
        "stdio-cmd": {"command": "npx", "args": ["-y", "@scope/server"], "env": {"A": "1"}},
    }}))
    entries = {e.name: e for e in read_config(config, environ={"HOME": "/root"})}
    assert "unknown type 'websocket'" in entries["ws"].error
    assert "type 'sse' needs a `url`" in entries["no-url"].error
    assert "environment variable NEXUS_TEST_UNSET_HOST is not set" in entries["undefined"].error
    assert "cannot expand ${input:token}" in entries["prompted"].error
    assert entries["Basic-Memory"].spec.argv == ["x"]  # a key made a name: its other characters one "-"
    assert "not a safe identifier" in entries["!!!"].error
    assert entries["defaulted"].spec == RemoteServer("https://example.test/mcp", "http", {})
    assert entries["legacy"].spec == RemoteServer("http://127.0.0.1:1/sse", "sse", {"K": "${env:HOME}"})
    assert entries["stdio-cmd"].spec == ServerCommand(["npx", "-y", "@scope/server"], str(tmp_path), {"A": "1"},
                                                      line="npx -y @scope/server")


@pytest.mark.parametrize("text, error", [
    ("{", "not valid JSON"),
    ('{"mcp": {}}', "no `mcpServers`"),
])
def test_unusable_file(tmp_path, text, error):
    config = tmp_path / "c.json"
    config.write_text(text)
    with pytest.raises(ValueError, match=error):
        read_config(config)


def test_server_that_fails_to_start_is_skipped(store, tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"mcpServers": {
        "dies": {"command": sys.executable, "args": ["-c", "import sys; print('no token', file=sys.stderr); "
                                                      "sys.exit(2)"]},
        "calc": {"command": "python", "args": ["-m", "registry.servers.calculator"], "cwd": str(REPO)},
    }}))
    outcomes = {o.name: o for o in register_config(config, store, timeout_s=20)}
    assert outcomes["dies"].status == "failed" and "failed to start" in outcomes["dies"].detail
    assert outcomes["dies"].detail.endswith("server stderr (last lines):\n    no token")  # why it died
    assert outcomes["calc"].status == "registered" and [s.name for s in store.list_servers()] == ["calc"]


def test_a_bare_python_runs_the_server_installed_on_path(nexus_home, tmp_path):
    """A config's `python -m MODULE` where Nexus's interpreter has no MODULE is the `python` on PATH, as an MCP
    client starts it (a server installed in its own virtualenv): before, Nexus's own interpreter ran it and
    failed with "No module named ...". A module Nexus's interpreter has (a bundled server) still runs there."""
    import sysconfig
    import venv

    other = tmp_path / "other-venv"
    venv.EnvBuilder(with_pip=False).create(other)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(other), "platbase": str(other)}))
    (site / "nexus_deps.pth").write_text(f"{sysconfig.get_path('purelib')}\n{REPO}\n")  # the mcp package, the repo
    (site / "elsewhere_calculator.py").write_text(
        "import runpy\nrunpy.run_module('registry.servers.calculator', run_name='__main__')\n")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "elsewhere": {"command": "python", "args": ["-m", "elsewhere_calculator"]},
        "bundled": {"command": "python", "args": ["-m", "registry.servers.units"], "cwd": str(REPO)}}}))
    path = f"{other / 'bin'}{os.pathsep}{os.environ['PATH']}"
    r = nexus("register", "--config", str(config), "--json", home=nexus_home, env={"PATH": path})
    status = {s["server"]: (s["status"], s["tools"]) for s in json.loads(r.stdout)["servers"]}
    assert status == {"elsewhere": ("registered", 4), "bundled": ("registered", 2)}, r.stderr
    assert ServerCommand.parse("python -m elsewhere_calculator", env={"PATH": path}).argv[0] == \
        str(other / "bin" / "python")
    assert ServerCommand.parse("python -m registry.servers.units").argv[0] == sys.executable
