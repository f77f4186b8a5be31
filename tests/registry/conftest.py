"""Registry test helpers: a store in the per-test NEXUS_HOME, a small catalogue file, server commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CATALOG = Path(__file__).resolve().parents[3] / "shared" / "data" / "routing" / "tools.jsonl"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(nexus_home):
    from registry.store import RegistryStore

    s = RegistryStore()
    yield s
    s.close()


@pytest.fixture
def small_catalog(tmp_path) -> Path:
    """A 30-tool JSONL catalogue written here (not copied from the public data)."""
    path = tmp_path / "small.jsonl"
    lines = []
    for i in range(30):
        lines.append(json.dumps({
            "name": f"tool_{i:02d}",
            "description": f"Do thing number {i}. More text.",
            "inputSchema": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "mode": {"enum": ["fast", "slow"], "default": "fast"}},
                "required": ["x"],
            },
        }))
    path.write_text("\n".join(lines) + "\n")
    return path
