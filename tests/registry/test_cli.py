"""The `nexus` CLI in subprocesses against the public catalogue: register >= 250 tools, list, show, stats, remove,
servers. (Registration speed is a benchmark's job, not a timed test's: the CPU differs between machines.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CATALOG = Path(__file__).resolve().parents[3] / "shared" / "data" / "routing" / "tools.jsonl"
REPO = Path(__file__).resolve().parents[2]


def nexus(*args: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, NEXUS_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "nexus_agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


@pytest.mark.skipif(not CATALOG.exists(), reason="public routing catalogue not present")
def test_register_catalogue_list_stats_remove(nexus_home):
    r = nexus("register", "--server", f"python -m registry.servers.catalog --catalog {CATALOG}", "--json",
              home=nexus_home)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert len(report["added"]) >= 250 and not report["rejected"]

    listed = json.loads(nexus("tools", "list", "--json", home=nexus_home).stdout)
    assert len(listed) == len(report["added"]) and listed[0]["inputSchema"]["type"] == "object"
    table = nexus("tools", "list", home=nexus_home).stdout
    assert f"{len(listed)} tools" in table and listed[0]["name"][:20] in table

    stats = json.loads(nexus("tools", "stats", "--json", home=nexus_home).stdout)
    assert stats["tools"] == len(listed) and stats["median_tokens"] <= 24 and stats["required_coverage"] == 1.0
    printed = nexus("tools", "stats", home=nexus_home).stdout
    assert "IR median tokens" in printed and "100.0%" in printed

    name = listed[0]["name"]
    shown = json.loads(nexus("tools", "show", name, "--json", home=nexus_home).stdout)
    assert shown["version"] == 1 and shown["ir"].startswith(name + "(")
    assert nexus("tools", "remove", name, home=nexus_home).returncode == 0
    assert nexus("tools", "show", name, home=nexus_home).returncode == 1
    servers = json.loads(nexus("servers", "list", "--json", home=nexus_home).stdout)
    assert servers[0]["name"] == "catalog" and servers[0]["tool_count"] == len(listed) - 1


def test_register_failing_server_exits_nonzero_with_message(nexus_home):
    r = nexus("register", "--server", f"{sys.executable} -c 'raise SystemExit(4)'", "--timeout", "5", home=nexus_home)
    assert r.returncode == 1 and "failed to start" in r.stderr


DIES_AT_START = """import sys
print("starting the duckdb server", file=sys.stderr)
for i in range(12):
    print(f"  traceback line {i}", file=sys.stderr)
print("AttributeError: 'Server' object has no attribute 'list_resources'", file=sys.stderr)
sys.exit(1)
"""


def test_server_that_dies_at_start_shows_its_last_stderr_lines(nexus_home, tmp_path):
    script = tmp_path / "dies.py"  # a server that fails as one built for another SDK version does: at import
    script.write_text(DIES_AT_START)
    r = nexus("register", "--server", f"python {script}", "--timeout", "20", home=nexus_home)
    assert r.returncode == 1 and "failed to start" in r.stderr, r.stderr
    quoted = r.stderr.split("server stderr (last lines):")[1].splitlines()[1:]
    assert quoted == [f"      traceback line {i}" for i in range(3, 12)] + [
        "    AttributeError: 'Server' object has no attribute 'list_resources'"]  # the last 10, indentation kept
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"duck": {"command": "python", "args": [str(script)]}}}))
    r = nexus("register", "--config", str(config), "--timeout", "20", home=nexus_home)
    assert r.returncode == 1 and "duck: MCP server" in r.stderr, r.stderr
    assert "AttributeError: 'Server' object has no attribute 'list_resources'" in r.stderr  # not just the 1st line


def test_tool_text_is_never_read_as_rich_markup(nexus_home, tmp_path):
    """A signature like `files: [str]` and a description holding rich tags print as written, not as styling."""
    tool = {"name": "git_add", "description": "Stage [bold]files[/bold] for [link=x]commit[/link].",
            "inputSchema": {"type": "object", "required": ["repo_path", "files"], "properties": {
                "repo_path": {"type": "string"}, "files": {"type": "array", "items": {"type": "string"}}}}}
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps(tool) + "\n")
    assert nexus("register", "--file", str(path), home=nexus_home).returncode == 0
    env = {"COLUMNS": "200"}
    listed = subprocess.run([sys.executable, "-m", "nexus_agent.cli", "tools", "list"], capture_output=True,
                            text=True, timeout=60, cwd=REPO, env=dict(os.environ, NEXUS_HOME=str(nexus_home), **env))
    assert "files: [str]" in listed.stdout, listed.stdout
    shown = nexus("tools", "show", "git_add", home=nexus_home).stdout
    assert "[bold]files[/bold]" in shown and "[link=x]commit[/link]" in shown and "files: [str]" in shown


def test_a_servers_environment_is_given_with_env(nexus_home):
    """`--env NAME=VALUE` (as a config file's `env`): stored as written (`${VAR}` resolved at each start), shown
    by `servers list --json`; a malformed one is refused naming it; with --json a failure is JSON too."""
    r = nexus("register", "--server", "python -m registry.servers.calculator", "--env", "TOKEN=${HOME}",
              "--env", "MODE=fast", home=nexus_home)
    assert r.returncode == 0, r.stderr
    servers = {s["name"]: s for s in json.loads(nexus("servers", "list", "--json", home=nexus_home).stdout)}
    assert servers["calculator"]["env"] == {"TOKEN": "${HOME}", "MODE": "<set>"}  # a literal value is not shown
    r = nexus("register", "--server", "python -m registry.servers.calculator", "--env", "NO_EQUALS", "--json",
              home=nexus_home)
    assert r.returncode == 1 and "--env 'NO_EQUALS': expected NAME=VALUE" in r.stderr
    assert "expected NAME=VALUE" in json.loads(r.stdout)["error"]


def test_a_server_that_prints_a_banner_to_stdout_registers_with_one_warning(nexus_home, tmp_path):
    """A stdio server that writes a line of its own to stdout before speaking JSON-RPC: the SDK skips the line
    (and logged a traceback for it); one warning names it now, and the server registers."""
    script = tmp_path / "banner.py"
    script.write_text("import runpy\nprint('Starting the calculator server v1.0 ...', flush=True)\n"
                      "runpy.run_module('registry.servers.calculator', run_name='__main__')\n")
    r = nexus("register", "--server", f"python {script}", home=nexus_home)
    assert r.returncode == 0 and "4 added" in r.stdout, r.stderr
    assert "not JSON-RPC (ignored): 'Starting the calculator server v1.0 ...'" in r.stderr
    assert "Traceback" not in r.stderr
