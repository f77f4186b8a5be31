"""Helpers for the `nexus serve` tests and their load test: free ports, OpenAI tools (gold ones and catalogue
distractors), raw POSTs and the server's stats."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from http_servers import stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "routing"
API_KEY = "sk-nexus-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def function(name: str, description: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


ADD = function("add", "Add two numbers and return their sum.",
               {"type": "object", "properties": {"a": {"type": "number", "description": "first addend"},
                                                 "b": {"type": "number", "description": "second addend"}},
                "required": ["a", "b"]})
MULTIPLY = function("multiply", "Multiply two numbers.",
                    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                     "required": ["x", "y"]})


def catalogue_tools(n: int, skip: set[str] = frozenset({"add", "multiply"})) -> list[dict]:
    """The first `n` catalogue tools the registry accepts (none named like the gold tools), as OpenAI tools."""
    from registry.model import Tool

    if not (DATA / "tools.jsonl").exists():
        pytest.skip("public routing catalogue not present")
    out = []
    for line in (DATA / "tools.jsonl").read_text().splitlines():
        t = json.loads(line)
        if t["name"] in skip:
            continue
        try:
            Tool.from_mcp(t)
        except ValueError:
            continue
        out.append(function(t["name"], t.get("description", ""), t["inputSchema"]))
        if len(out) == n:
            return out
    raise AssertionError(f"the catalogue holds fewer than {n} valid tools")


def stats(serve_url: str) -> dict:
    req = urllib.request.Request(f"{serve_url}/v1/nexus/stats", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def post(serve_url: str, body: bytes | dict, key: str | None = API_KEY, path: str = "/v1/chat/completions"):
    """(status, decoded JSON body) of a raw POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{serve_url}{path}", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stream_events(serve_url: str, body: dict, close_after: int | None = None) -> list[str]:
    """The SSE `data:` payloads of one streamed request; `close_after`: drop the connection after that many."""
    u = urllib.parse.urlparse(serve_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(dict(body, stream=True)),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200
    out = []
    for line in resp:
        if line.startswith(b"data: "):
            out.append(line[6:].strip().decode())
            if close_after is not None and len(out) >= close_after:
                conn.sock.close()
                conn.close()
                return out
    conn.close()
    return out


READY_TIMEOUT_S = 120


@contextmanager
def running_serve(home, *args: str):
    """A `nexus serve` subprocess with its home in `home`, started with `args`; yields its root URL."""
    port = free_port()
    log = home / "server.log"
    env = dict(os.environ, NEXUS_HOME=str(home), PYTHONPATH=str(ROOT), NEXUS_THREADS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "nexus_agent.cli", "serve", "--port", str(port), "--api-key", API_KEY, *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health", lambda r: r.get("status") == "ok", "nexus serve", log, READY_TIMEOUT_S)
        yield url
    finally:
        stop(proc)
