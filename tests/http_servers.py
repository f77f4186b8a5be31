"""Real MCP servers over HTTP for the tests: a bundled (or probe) server started with `--http` / `--sse` on a free
port of 127.0.0.1, and a TCP listener that accepts connections and never answers."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READY = re.compile(r"serving (http://\S+)")


class HttpServer:
    """One server process: `start()` waits for its `serving URL` line; `kill()` stops it by its PID (SIGKILL);
    `restart()` starts it again on the same port."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.argv, self.log, self.env = argv, log, env
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.port = 0

    def start(self, timeout_s: float = 30.0) -> "HttpServer":
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   **(self.env or {}))
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen([*self.argv, "--port", str(self.port)], stdout=subprocess.DEVNULL,
                                         stderr=err, cwd=REPO, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = READY.search(self.log.read_text())
            if m:
                self.url = m.group(1)
                self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv} exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.argv} did not print its URL within {timeout_s} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, 9)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> "HttpServer":
        self.kill()
        return self.start()


def bundled_argv(module: str, *args: str, transport: str = "--http") -> list[str]:
    """argv of a server module (`registry.servers.calculator`) or script path, serving HTTP on 127.0.0.1."""
    head = [sys.executable, module] if module.endswith(".py") else [sys.executable, "-m", module]
    return [*head, *args, transport]


class SilentListener:
    """A TCP socket on 127.0.0.1 that accepts connections and never answers (a hung remote server)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"

    def close(self) -> None:
        self.sock.close()


def wait_ready(proc: subprocess.Popen, url: str, ready, what: str, log: Path, timeout_s: float) -> None:
    """Poll GET `url` until `ready(parsed JSON)` is true; pytest.fail with the log's tail when the process
    exits or `timeout_s` passes first."""
    import json
    import urllib.request

    import pytest

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if ready(json.load(r)):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not ready after {timeout_s} s: {log.read_text()[-3000:]}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM by PID, then SIGKILL when it has not exited within `grace_s`."""
    import signal

    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
