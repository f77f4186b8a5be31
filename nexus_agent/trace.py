"""The agent's JSONL trace: one event per line (route decisions, arguments, tool results, cache, timings).

Every event has `event` (its kind), `t_ms` (milliseconds since the trace opened) and `turn`; the rest depends
on the kind: route, args, validation, full_schema, tool_call, answer, memory, error.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable


class Trace:
    """Collects events in memory, appends them to `path` when given, and forwards them to `listener`."""

    def __init__(self, path: str | Path | None = None, listener: Callable[[dict], None] | None = None):
        self.t0 = time.perf_counter()
        self.events: list[dict] = []
        self.turn = 0
        self.listener = listener
        self._file = None
        if path:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self._file = p.open("a", encoding="utf-8")

    def emit(self, event: str, **data: Any) -> dict:
        row = {"event": event, "turn": self.turn, "t_ms": round((time.perf_counter() - self.t0) * 1e3, 2), **data}
        self.events.append(row)
        if self._file:
            self._file.write(json.dumps(row, default=str) + "\n")
            self._file.flush()
        if self.listener:
            self.listener(row)
        return row

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
