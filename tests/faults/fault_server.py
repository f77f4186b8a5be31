"""A real stdio MCP server that misbehaves on demand, for the fault suite.

`python tests/faults/fault_server.py [--crash-at-start]`. Tools:
- echo(text): answers `text`;
- crash_mid_call(): kills the process before answering, every time;
- crash_after_reply(): answers, then the process dies 0.2 s later (a crash between calls);
- hang(seconds): sleeps (a hung tool when longer than the client's timeout);
- garbage(): writes a non-JSON line onto the protocol stream, then answers;
- huge(mb): answers with a result of `mb` megabytes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.decorator import tool  # noqa: E402
from registry.servers.runtime import handlers_from_functions, serve  # noqa: E402


@tool
def echo(text: str) -> dict:
    """Answer the text back.

    Args:
        text: what to answer
    """
    return {"text": text}


@tool
def crash_mid_call() -> dict:
    """Die while serving the call."""
    os._exit(3)


@tool
def crash_after_reply() -> dict:
    """Answer, then die shortly after."""
    threading.Timer(0.2, os._exit, args=(4,)).start()
    return {"status": "answered, dying"}


@tool
def hang(seconds: float) -> dict:
    """Sleep for a number of seconds.

    Args:
        seconds: how long to sleep
    """
    time.sleep(seconds)
    return {"slept": seconds}


@tool
def garbage() -> dict:
    """Write garbage onto the protocol stream, then answer."""
    os.write(1, b"\x00\xffthis is not JSON-RPC {{{\n")
    return {"status": "answered after garbage"}


@tool
def huge(mb: int) -> dict:
    """Answer with a result of `mb` megabytes.

    Args:
        mb: megabytes of text to return
    """
    return {"blob": "x" * (mb * 1024 * 1024)}


if __name__ == "__main__":
    if "--crash-at-start" in sys.argv:
        print("fault_server: crashing at start on purpose", file=sys.stderr)
        sys.exit(5)
    serve("faulty", handlers_from_functions([echo, crash_mid_call, crash_after_reply, hang, garbage, huge]))
