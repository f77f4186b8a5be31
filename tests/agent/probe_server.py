"""A real stdio MCP server for the agent tests: records every call under $NEXUS_HOME, and can crash or hang.

Run as `python tests/agent/probe_server.py`. Tools:
- record_sum(a, b): appends the arguments to $NEXUS_HOME/probe_calls.jsonl and returns their sum;
- crash_once(): kills the process the first time ($NEXUS_HOME/probe_crashed marks it), then answers;
- always_crash(): kills the process every time;
- sleep_for(seconds): sleeps, then answers (a hung tool when seconds exceeds the client's timeout);
- city_population(city): knows no city, and says so in a plain result (no tool error), as many servers do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.decorator import tool  # noqa: E402
from registry.servers.runtime import handlers_from_functions, serve  # noqa: E402

HOME = Path(os.environ.get("NEXUS_HOME", "."))


@tool
def record_sum(a: int, b: int) -> dict:
    """Record two integers and add them.

    Args:
        a: first integer
        b: second integer
    """
    with open(HOME / "probe_calls.jsonl", "a") as f:
        f.write(json.dumps({"tool": "record_sum", "arguments": {"a": a, "b": b}}) + "\n")
    return {"sum": a + b}


@tool
def crash_once() -> dict:
    """Crash the server the first time it is called."""
    marker = HOME / "probe_crashed"
    if not marker.exists():
        marker.write_text("1")
        os._exit(3)
    return {"status": "recovered"}


@tool
def always_crash() -> dict:
    """Crash the server on every call."""
    os._exit(3)


@tool
def sleep_for(seconds: float) -> dict:
    """Sleep for a number of seconds."""
    time.sleep(seconds)
    return {"slept": seconds}


@tool
def city_population(city: str) -> str:
    """Population of a city.

    Args:
        city: the city's name
    """
    return f"Error: no city named {city!r} in the census data"


if __name__ == "__main__":
    serve("probe", handlers_from_functions([record_sum, crash_once, always_crash, sleep_for, city_population]))
