"""The Nexus home folder (`NEXUS_HOME`, default ~/.nexus) and the paths inside it (DESIGN section 1)."""

from __future__ import annotations

import json
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


def model_profile_path(fingerprint: str) -> Path:
    """A model's profile file: what was measured about it (decide setting, splice repairs, backend probes), one
    section per owner."""
    return home_path("profiles", f"{fingerprint}.json")


def read_model_profile(fingerprint: str) -> dict:
    """The model's profile file as a dict ({} when absent); ValueError when it is not JSON."""
    path = model_profile_path(fingerprint)
    return json.loads(path.read_text()) if path.exists() else {}


def update_model_profile(fingerprint: str, keys: tuple[str, ...], value) -> Path:
    """Set `value` at `keys` (a section, then sub-keys) in the model's profile file, every other entry kept,
    written atomically."""
    from registry.atomic import write_atomic

    data = read_model_profile(fingerprint)
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    path = model_profile_path(fingerprint)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
