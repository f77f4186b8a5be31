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
