"""Shared fixtures: the real packaged models, loaded once per test session, and a private NEXUS_HOME per test.

`backend` runs a test on every local backend in `native.registry.BACKENDS` (those with sessions: not
`text_only`); `mlx_backend` / `llamacpp_backend` are the same loaded instances, for backend-specific tests.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(__file__))

from native.registry import list_backends  # noqa: E402  (after the environment above)

# Property tests in CI (CI set, as .ci/run does) are derandomized: every run tries the same examples, so a failure
# reproduces from the log and an unrelated change never turns CI red. Elsewhere they draw fresh examples (and keep
# failures in .hypothesis/). HYPOTHESIS_PROFILE=ci|default picks one explicitly. Loaded before the test modules
# import, so their own `settings(...)` inherit it.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default"))

LOCAL_BACKENDS = list_backends(text_only=False)


@pytest.fixture(autouse=True)
def nexus_home(tmp_path, monkeypatch):
    home = tmp_path / "nexus-home"
    monkeypatch.setenv("NEXUS_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def loaded_backends():
    """`get(name)`: the packaged model on local backend `name`, loaded on first use and closed at the end."""
    from native import load_backend

    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_backend(name)
        return loaded[name]

    yield get
    for b in loaded.values():
        b.close()


@pytest.fixture(scope="session")
def mlx_backend(loaded_backends):
    return loaded_backends("mlx")


@pytest.fixture(scope="session")
def llamacpp_backend(loaded_backends):
    return loaded_backends("llamacpp")


@pytest.fixture(scope="session", params=LOCAL_BACKENDS)
def backend(request, loaded_backends):
    return loaded_backends(request.param)


QWEN = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="session")
def qwen_gguf(tmp_path_factory) -> str:
    """The packaged tool-trained Qwen2.5-Coder-0.5B-Instruct GGUF, assembled once per session from its chunk
    packages (a test dependency) into a session folder."""
    from native.model_files import assemble_chunked

    return str(assemble_chunked(QWEN, folder=tmp_path_factory.mktemp("qwen") / "models"))


@pytest.fixture(scope="session")
def qwen_backends(qwen_gguf):
    """`get(name)`: Qwen2.5-Coder-0.5B on local backend `name`, loaded on first use and closed at the end."""
    from native import load_backend

    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_backend(name, qwen_gguf)
        return loaded[name]

    yield get
    for b in loaded.values():
        b.close()


PROBE_SERVER = os.path.join(os.path.dirname(__file__), "agent", "probe_server.py")


@pytest.fixture
def probe_store(nexus_home):
    """The probe MCP server (a real stdio subprocess that records every call under NEXUS_HOME), registered in a
    fresh store of the per-test home; shared by the agent and OpenAI-backend tests."""
    from registry.client import list_server_tools
    from registry.store import RegistryStore

    cmd = f"{sys.executable} {PROBE_SERVER}"
    store = RegistryStore()
    name, tools = list_server_tools(cmd)
    store.upsert_server(name, cmd)
    store.add_tools(tools, server=name)
    yield store
    store.close()


@pytest.fixture
def http_server(tmp_path):
    """`start(module, *args, transport="--http", env=None)`: a real MCP server (a bundled server module such as
    `registry.servers.calculator`, or a script path) over streamable HTTP (or `--sse`) on a free port of
    127.0.0.1 (tests/http_servers.py). Every server started is killed by its PID after the test."""
    from http_servers import HttpServer, bundled_argv

    started = []

    def start(module: str, *args: str, transport: str = "--http", env: dict | None = None) -> HttpServer:
        log = tmp_path / f"http-server-{len(started)}.log"
        srv = HttpServer(bundled_argv(module, *args, transport=transport), log, env)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.kill()
