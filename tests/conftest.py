"""Shared fixtures: the real packaged models, loaded once per test session, and a private NEXUS_HOME per test."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def nexus_home(tmp_path, monkeypatch):
    home = tmp_path / "nexus-home"
    monkeypatch.setenv("NEXUS_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def mlx_backend():
    from native import load_backend

    b = load_backend("mlx")
    yield b
    b.close()


@pytest.fixture(scope="session")
def llamacpp_backend():
    from native import load_backend

    b = load_backend("llamacpp")
    yield b
    b.close()


@pytest.fixture(scope="session", params=["mlx", "llamacpp"])
def backend(request):
    return request.getfixturevalue(f"{request.param}_backend")


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
