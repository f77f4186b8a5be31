"""Bundled MCP stdio servers, each runnable as `python -m registry.servers.<name>`.

BUNDLED maps a server name to its module; it drives `nexus register --bundled NAME` and the test matrix.
"""

BUNDLED = {
    "calculator": "registry.servers.calculator",
    "clock": "registry.servers.clock",
    "files": "registry.servers.files",
    "notes": "registry.servers.notes",
    "units": "registry.servers.units",
    "catalog": "registry.servers.catalog",
}


def command_for(name: str) -> str:
    """The command line that starts bundled server `name`."""
    if name not in BUNDLED:
        raise ValueError(f"no bundled server {name!r}; choose one of {', '.join(BUNDLED)}")
    return f"python -m {BUNDLED[name]}"
