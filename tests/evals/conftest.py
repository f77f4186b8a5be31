"""The public routing data the evals read (tools.jsonl, queries.jsonl, queries_irrelevant.jsonl), found as
`../shared/data/routing` beside the repository and passed to every eval explicitly."""

from __future__ import annotations

from pathlib import Path

import pytest

ROUTING_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "routing"


@pytest.fixture
def routing_data() -> Path:
    if not (ROUTING_DATA / "tools.jsonl").is_file():
        pytest.skip(f"public routing data not present at {ROUTING_DATA}")
    return ROUTING_DATA
