"""The Nexus home folder (`NEXUS_HOME`, default ~/.nexus) and the paths inside it (DESIGN section 1)."""

from __future__ import annotations

import os
from pathlib import Path


def nexus_home() -> Path:
    """The Nexus home, created on first use."""
    home = Path(os.environ.get("NEXUS_HOME") or Path.home() / ".nexus").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def home_path(*parts: str) -> Path:
    """A path inside the Nexus home; parent folders are created."""
    path = nexus_home().joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
