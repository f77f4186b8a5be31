"""Agent test fixtures: the probe server registered in the per-test NEXUS_HOME."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parent / "probe_server.py"
PROBE_CMD = f"{sys.executable} {PROBE}"


@pytest.fixture
def probe_store(nexus_home):
    from registry.client import list_server_tools
    from registry.store import RegistryStore

    store = RegistryStore()
    name, tools = list_server_tools(PROBE_CMD)
    store.upsert_server(name, PROBE_CMD)
    store.add_tools(tools, server=name)
    yield store
    store.close()
