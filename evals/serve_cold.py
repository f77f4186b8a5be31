"""Cold start of `nexus serve`: how long a tool list nobody has seen takes, and the same list after a restart.

Per size N: a fresh Nexus home, `nexus serve` started as a subprocess, one request whose `tools` are the first N
catalogue tools (one of them the gold tool of a public query); the same request again (the list cached in
memory); then the server is stopped and started again on the same home (its embedding store,
`slb.embed_store`) and the request sent once more. Reported: the whole first request (`cold_ms`), the repeat
(`repeat_ms`), the first request after the restart (`restart_ms`), the server's own "tool list ... routable
in X s" time for the cold list and after the restart (`cold_list_ms`, `restart_list_ms`: embedding or store
lookup, index and first route), and how many tools each start embedded (from the server's log line and
/v1/nexus/stats). Targets (issue 38): a cold 1,000-tool list ready in <= 10 s; after a restart <= 1 s.

Threads: the server gets the eval's environment; `NEXUS_THREADS`/`OMP_NUM_THREADS` (1 under the project's
`/tmp/heavy`) bound the embedder's torch threads, so a one-core run says so in `threads`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

LINE = re.compile(r"nexus serve: tool list of (\d+) tools: (\d+) embedded, (\d+) from the store, (\d+) in memory, "
                  r"([\d.]+) s(?: \((\w+)\))?; routable in ([\d.]+) s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", required=True, metavar="FILE", help="JSONL of MCP tools (the public tools.jsonl)")
    p.add_argument("--queries", required=True, metavar="FILE", help="JSONL of {query, gold_tool} (queries.jsonl)")
    add_cold_start_argument(p)


def add_cold_start_argument(p: argparse.ArgumentParser, default: str = "1000") -> None:
    p.add_argument("--cold-start", default=default, metavar="SIZES",
                   help=f"tool-list sizes whose cold start and restart are measured (default {default or 'none'})")


def _tool_list(catalog: str, queries: str, n: int) -> tuple[list[dict], str]:
    """The first `n` catalogue tools the registry accepts, as OpenAI tools, and a query whose gold tool is one."""
    from registry.model import Tool
    from registry.sources import load_tool_file

    tools, names = [], set()
    for t in load_tool_file(catalog):
        try:
            tool = Tool.from_mcp(t)
        except ValueError:
            continue
        if tool.name in names:
            continue
        names.add(tool.name)
        tools.append({"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                       "parameters": tool.input_schema}})
        if len(tools) == n:
            break
    if len(tools) < n:
        raise ValueError(f"{catalog} holds {len(tools)} valid tools, fewer than {n}")
    for line in Path(queries).read_text().splitlines():
        q = json.loads(line) if line.strip() else {}
        if q.get("gold_tool") in names:
            return tools, q["query"]
    raise ValueError(f"no query of {queries} has its gold tool among the first {n} catalogue tools")


def _lines(log: Path) -> list[dict]:
    return [{"tools": int(m[0]), "embedded": int(m[1]), "stored": int(m[2]), "memory": int(m[3]),
             "embed_s": float(m[4]), "dtype": m[5] or None, "routable_s": float(m[6])}
            for m in LINE.findall(log.read_text(errors="replace"))]


def _get(port: int, path: str, body: dict | None = None, timeout: float = 600.0) -> dict:
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def measure(n: int, args, env: dict) -> dict:
    """One size: cold request, repeat, restart on the same home; times in ms, counts from the log and stats."""
    from evals.serve import _free_port, _start, _stop  # the serve eval's subprocess handling

    tools, query = _tool_list(args.catalog, args.queries, n)
    cmd = [sys.executable, "-m", "nexus_agent.cli", "serve", "--max-body-mb", "64", "--port"]
    body = {"model": "smollm2", "messages": [{"role": "user", "content": query}], "tools": tools,
            "tool_choice": "auto", "max_tokens": 64, "temperature": 0}
    out: dict = {}
    with tempfile.TemporaryDirectory() as home:
        env = dict(env, NEXUS_HOME=home)
        for phase in ("cold", "restart"):
            port, log = _free_port(), Path(home) / f"{phase}.log"
            t0 = time.perf_counter()
            proc = _start(cmd + [str(port)], port, log, env)
            out[f"{phase}_start_s"] = round(time.perf_counter() - t0, 2)
            try:
                t0 = time.perf_counter()
                _get(port, "/v1/chat/completions", body, args.timeout)
                out[f"{phase}_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
                if phase == "cold":
                    t0 = time.perf_counter()
                    _get(port, "/v1/chat/completions", body, args.timeout)
                    out["repeat_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
                stats = _get(port, "/v1/nexus/stats")
            finally:
                _stop(proc)
            line = [x for x in _lines(log) if x["tools"] == n][-1]
            out[f"{phase}_list_ms"] = round(line["routable_s"] * 1e3, 1)
            out[f"{phase}_embed_ms"] = round(line["embed_s"] * 1e3, 1)
            out["embedded" if phase == "cold" else "restart_embedded"] = line["embedded"]
            if phase == "cold":
                out["embed_dtype"] = line["dtype"]  # bfloat16 where the CPU multiplies it natively
            out[f"{phase}_tools_embedded"] = stats["tools_embedded"]  # /v1/nexus/stats, the warm-up tool included
        print(f"  cold start {n} tools: {out}", file=sys.stderr, flush=True)
    return out


def run(args: argparse.Namespace) -> dict:
    """{"cold_start": {"<N>": {...}}, "threads": ...} for every size of `args.cold_start`."""
    for flag, path in (("--catalog", args.catalog), ("--queries", args.queries)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    args.timeout = getattr(args, "timeout", 600.0)  # `nexus eval serve` has its own --timeout
    sizes = [int(s) for s in str(args.cold_start).split(",") if s.strip()]
    env = dict(os.environ)
    result = {"cold_start": {str(n): measure(n, args, env) for n in sizes},
              "threads": env.get("NEXUS_THREADS") or env.get("OMP_NUM_THREADS") or f"all ({os.cpu_count()})"}
    print(table(result))
    return result


def table(r: dict) -> str:
    from evals.render import md_table

    def ms(v):
        return None if v is None else f"{v:,.0f}"

    rows = [[n, f'{x["embedded"]} ({x["embed_dtype"]})' if x.get("embed_dtype") else x["embedded"],
             ms(x["cold_list_ms"]), ms(x["cold_ms"]), ms(x.get("repeat_ms")), x["restart_embedded"],
             ms(x["restart_list_ms"]), ms(x["restart_ms"])]
            for n, x in sorted((r.get("cold_start") or {}).items(), key=lambda kv: int(kv[0]))]
    return md_table(["tools", "embedded (cold)", "cold list ready (ms)", "cold request (ms)", "same list again (ms)",
                     "embedded (restart)", "restart list ready (ms)", "restart request (ms)"], rows) + \
        f"\n\nEmbedder threads: {r.get('threads')} (the run's NEXUS_THREADS or OMP_NUM_THREADS; 1: one core)."


FIGURES = ()
