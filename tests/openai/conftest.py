"""A real llama-cpp-python server (`python -m llama_cpp.server`, started through `native.llamacpp_peer` for the
same weight-repacking rule as our backend) on 127.0.0.1 over the packaged GGUF, started once per test session
and stopped by its PID; the openai backend pointed at it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from http_servers import stop, wait_ready

PROBE = Path(__file__).resolve().parents[1] / "agent" / "probe_server.py"
READY_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def openai_server(tmp_path_factory):
    """The server's base URL, e.g. http://127.0.0.1:PORT/v1 (one thread: the machine's cores are shared)."""
    pytest.importorskip("uvicorn", reason='llama_cpp.server needs llama-cpp-python[server]')
    from native.model_files import default_model_path

    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    cmd = [sys.executable, "-m", "native.llamacpp_peer", "--model", default_model_path(), "--host", "127.0.0.1",
           "--port", str(port), "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", "2048"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(proc, f"{base}/models", lambda r: bool(r.get("data")), "llama_cpp.server", log, READY_TIMEOUT_S)
        yield base
    finally:
        stop(proc, 15)


@pytest.fixture(scope="session")
def openai_backend(openai_server):
    from native import load_backend

    b = load_backend("openai", base_url=openai_server)
    yield b
    b.close()
