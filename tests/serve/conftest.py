"""A real `nexus serve` subprocess on a free 127.0.0.1 port over the packaged SmolLM2 and MiniLM, started once per
test session (with an API key and a 1 MB body limit) and stopped by its PID; `running_serve` starts others (the
Qwen server of test_decide_serve.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
from http_servers import stop, wait_ready
from serve_helpers import API_KEY, ROOT, free_port

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


@pytest.fixture(scope="session")
def serve_url(tmp_path_factory):
    """The server's root URL, e.g. http://127.0.0.1:PORT (its API is under /v1)."""
    with running_serve(tmp_path_factory.mktemp("serve-home"), "--max-body-mb", "1", "--n-ctx", "4096") as url:
        yield url


@pytest.fixture(scope="session")
def client(serve_url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{serve_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


