"""`nexus serve` against llama-cpp-python's own OpenAI server on the same GGUF, over HTTP, streamed.

Both servers are started by this eval as subprocesses on free 127.0.0.1 ports (one thread each; ours: `nexus serve`;
the peer: `python -m llama_cpp.server --chat_format chatml-function-calling --n_ctx 8192`, through
`native.llamacpp_peer` for our backend's weight-repacking rule) and killed by PID at
the end. Requests are public routing queries (queries.jsonl) with their gold tool inside a `tools` list of N
catalogue tools (N = 10 / 50 / 250 / 1000; each size takes its own distractors, so the first request of a size
meets tools neither server has seen), `tool_choice: "auto"`, `stream: true`; the same requests go to both.

Per request: time to the first tool-call byte (the first SSE chunk carrying `delta.tool_calls`) and to the
complete tool call (the chunk with `finish_reason`), whether a tool was called, whether it was the gold one, and
whether its arguments parse and validate against that tool's schema. The first request of each size is sent
twice (timed to the end of the reply, call or not): the repeat shows what the schema cache saves (ours embeds
and indexes a tool list once). Throughput: 4 clients at once, each sending requests over the 10-tool lists. A
peer request that fails (its prompt of every schema overflows the context, or an error) is counted as a
failure with its message, never as a zero time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from evals.render import Figure, md_table, pct, pyplot

READY_TIMEOUT_S = 180
SERVERS = ("nexus", "llama_cpp")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", required=True, metavar="FILE", help="JSONL of MCP tools (the public tools.jsonl)")
    p.add_argument("--queries", required=True, metavar="FILE", help="JSONL of {query, gold_tool} (queries.jsonl)")
    p.add_argument("--sizes", default="10,50,250,1000")
    p.add_argument("--requests", type=int, default=4, help="queries per size (default 4)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients in the throughput run")
    p.add_argument("--throughput-requests", type=int, default=3, help="requests per client in the throughput run")
    p.add_argument("--no-peer", action="store_true", help="measure nexus serve only")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], port: int, log: Path, env: dict) -> subprocess.Popen:
    """Start a server and wait until its /v1/models answers."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v1/models")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.5)
    _stop(proc)
    raise RuntimeError(f"{' '.join(cmd[:3])} not ready after {READY_TIMEOUT_S} s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def chat_request(port: int, body: dict, timeout: float) -> dict:
    """One chat request, streamed when body["stream"]: ms to the first tool-call chunk and to the finish (the
    response, non-streamed), the reply's first call, or the error. A stream that ends without a finish_reason
    (the server dropped it) is an error."""
    out = {"first_tool_ms": None, "complete_ms": None, "end_ms": None, "tool": None, "arguments": "",
           "finish": None, "content": "", "error": None}
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read().decode('utf-8', 'replace')[:300]}"
            return out
        if not body.get("stream"):
            reply = json.loads(resp.read())
            out["end_ms"] = out["complete_ms"] = (time.perf_counter() - t0) * 1e3
            choice = reply["choices"][0]
            calls = choice["message"].get("tool_calls") or []
            out["finish"], out["content"] = choice.get("finish_reason"), choice["message"].get("content") or ""
            if calls:
                out["first_tool_ms"] = out["complete_ms"]
                out["tool"], out["arguments"] = calls[0]["function"]["name"], calls[0]["function"]["arguments"]
            return out
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out["error"] = f"stream error: {json.dumps(event['error'])[:300]}"
                break
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                for call in delta.get("tool_calls") or []:
                    if out["first_tool_ms"] is None:
                        out["first_tool_ms"] = (time.perf_counter() - t0) * 1e3
                    fn = call.get("function") or {}
                    if call.get("index", 0) == 0:
                        out["tool"] = out["tool"] or fn.get("name")
                        out["arguments"] += fn.get("arguments") or ""
                out["content"] += delta.get("content") or ""
                if choice.get("finish_reason"):
                    out["finish"] = choice["finish_reason"]
                    out["complete_ms"] = (time.perf_counter() - t0) * 1e3
        out["end_ms"] = (time.perf_counter() - t0) * 1e3  # the whole reply, [DONE] included
        if out["finish"] is None and out["error"] is None:
            out["error"] = "the stream ended without a finish_reason (the server dropped it; see server_errors)"
        conn.close()
    except (OSError, ValueError, KeyError, IndexError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def server_errors(log: Path) -> dict[str, int]:
    """The exceptions a server logged (`ValueError: Requested tokens (34477) exceed context window of 8192`), with
    how often: a server that drops a stream says why only in its log."""
    import re

    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^(?:\s*\|\s*)?([A-Za-z_.]*(?:Error|Exception)): (.+)$", line)
        if m:
            key = re.sub(r"\(\d+\)", "(N)", f"{m.group(1)}: {m.group(2)}")[:200]
            counts[key] = counts.get(key, 0) + 1
    return counts


def _valid(args_text: str, schema: dict) -> bool:
    import jsonschema

    try:
        value = json.loads(args_text)
        jsonschema.validate(value, schema)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return isinstance(value, dict)


def _openai_tool(t) -> dict:
    return {"type": "function", "function": {"name": t.name, "description": t.description,
                                             "parameters": t.input_schema}}


def _workload(args) -> tuple[dict[int, list[dict]], dict]:
    """Per size: requests (query, gold, tool list); and every tool's schema by name."""
    import numpy as np

    from registry.model import Tool
    from registry.sources import load_tool_file

    tools = {}
    for t in load_tool_file(args.catalog):
        try:
            tool = Tool.from_mcp(t)
        except ValueError:
            continue
        tools.setdefault(tool.name, tool)
    queries = [json.loads(x) for x in Path(args.queries).read_text().splitlines() if x.strip()]
    rng = np.random.default_rng(args.seed)
    queries = [queries[i] for i in rng.permutation(len(queries)) if queries[i]["gold_tool"] in tools]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    golds = {q["gold_tool"] for q in queries[: args.requests * len(sizes)]}
    pool = [n for n in rng.permutation(sorted(tools)) if n not in golds]
    if sum(sizes) > len(pool):
        raise ValueError(f"sizes {args.sizes} need {sum(sizes)} distractors; the catalogue has {len(pool)}")
    plan, start = {}, 0
    for k, size in enumerate(sizes):
        distractors, start = pool[start:start + size - 1], start + size - 1
        rows = []
        for q in queries[k * args.requests:(k + 1) * args.requests]:
            at = int(rng.integers(0, size))  # one fixed distractor order per size: a client's list is stable
            names = distractors[:at] + [q["gold_tool"]] + distractors[at:]
            rows.append({"query": q["query"], "gold": q["gold_tool"], "tools": [_openai_tool(tools[n]) for n in names]})
        plan[size] = rows
    return plan, tools


SYSTEM = "You are a helpful assistant. Call a function when one fits the request."


def _body(model: str, row: dict, stream: bool = True) -> dict:
    """The request both servers get. The system message matters to the peer: chatml-function-calling renders
    the function list inside the system turn, so without one the peer's model never sees the tools."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["query"]}]
    return {"model": model, "messages": messages, "tools": row["tools"],
            "tool_choice": "auto", "stream": stream, "max_tokens": 256, "temperature": 0}


def _summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["error"] is None]
    calls = [r for r in ok if r["tool"]]

    def med(key):
        vals = [r[key] for r in calls if r[key] is not None]
        return round(statistics.median(vals), 1) if vals else None

    return {"requests": len(rows), "failures": len(rows) - len(ok),
            "errors": sorted({r["error"][:160] for r in rows if r["error"]})[:3],
            "called": len(calls) / len(ok) if ok else None,
            "gold": sum(r["tool"] == r["gold"] for r in calls) / len(ok) if ok else None,
            "args_valid": sum(r["valid"] for r in calls) / len(calls) if calls else None,
            "first_tool_ms": med("first_tool_ms"), "complete_ms": med("complete_ms")}


MODES = ("streamed", "non_streamed")


def _measure(name: str, port: int, model: str, plan: dict, tools: dict, args) -> dict:
    """Per mode and size: every request's row and their summary; the first request is sent twice."""
    out = {mode: {} for mode in MODES}
    for size, rows in plan.items():
        done = {mode: [] for mode in MODES}
        cells = {mode: out[mode].setdefault(str(size), {}) for mode in MODES}
        for k, row in enumerate(rows):
            for mode in MODES:  # the same request streamed, then not
                body = _body(model, row, mode == "streamed")
                r = chat_request(port, body, args.timeout)
                schema = tools[r["tool"]].input_schema if r["tool"] in tools else None
                r.update(gold=row["gold"], valid=schema is not None and _valid(r["arguments"], schema))
                done[mode].append(r)
                if k == 0:  # the same list again: what a repeated tool list costs (whole reply; None: failed)
                    again = chat_request(port, body, args.timeout)
                    cells[mode].update(cold_ms=None if r["error"] else round(r["end_ms"], 1),
                                       repeat_ms=None if again["error"] else round(again["end_ms"], 1),
                                       repeat_error=again["error"])
                print(f"  {name} {mode} {size} tools: {r['tool']} (gold {row['gold']}) first {r['first_tool_ms']} "
                      f"complete {r['complete_ms']} error {r['error']}", file=sys.stderr, flush=True)
        for mode in MODES:
            cells[mode].update(_summary(done[mode]), rows=[{k: v for k, v in r.items() if k != "content"}
                                                           for r in done[mode]])
    return {"modes": out, "throughput": _throughput(port, model, plan[min(plan)], args)}


def _throughput(port: int, model: str, rows: list[dict], args) -> dict:
    """`clients` threads at once, each sending `throughput_requests` non-streamed requests (the peer cannot stream
    an automatic tool choice)."""
    results: list[dict] = []

    def client(i: int) -> None:
        for j in range(args.throughput_requests):
            results.append(chat_request(port, _body(model, rows[(i + j) % len(rows)], False), args.timeout))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["error"] is None]
    return {"clients": args.clients, "requests": len(results), "failures": len(results) - len(ok),
            "errors": sorted({r["error"][:160] for r in results if r["error"]})[:3], "wall_s": round(wall, 2),
            "requests_per_s": round(len(ok) / wall, 3) if ok else None}


def run(args: argparse.Namespace) -> dict:
    for flag, path in (("--catalog", args.catalog), ("--queries", args.queries)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    import tempfile

    from native.model_files import default_model_path

    plan, tools = _workload(args)
    gguf = default_model_path()
    env = dict(os.environ, NEXUS_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = {"sizes": sorted(plan), "requests": args.requests, "seed": args.seed, "model": os.path.basename(gguf),
              "servers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        env["NEXUS_HOME"] = tmp
        commands = {"nexus": lambda p: [sys.executable, "-m", "nexus_agent.cli", "serve", "--port", str(p),
                                        "--max-body-mb", "64"],
                    "llama_cpp": lambda p: [sys.executable, "-m", "native.llamacpp_peer", "--model", gguf,
                                            "--chat_format", "chatml-function-calling", "--n_ctx", "8192",
                                            "--n_threads", "1", "--n_threads_batch", "1", "--host", "127.0.0.1",
                                            "--port", str(p)]}
        for name in SERVERS[:1] if args.no_peer else SERVERS:
            port = _free_port()
            proc = _start(commands[name](port), port, Path(tmp) / f"{name}.log", env)
            try:
                model = "smollm2" if name == "nexus" else gguf
                result["servers"][name] = _measure(name, port, model, plan, tools, args)
            finally:
                _stop(proc)
            result["servers"][name]["server_errors"] = server_errors(Path(tmp) / f"{name}.log")
    print(table(result))
    return result


def table(r: dict) -> str:
    """Markdown: per server, mode and tool-list size, time to the first tool-call byte and to the complete call,
    the cold vs repeated tool list, call / gold-tool / valid-argument rates and failures; then throughput and
    the errors each server logged."""
    rows = []
    for name, s in r["servers"].items():
        for mode, sizes in s["modes"].items():
            for size in sorted(sizes, key=int):
                x = sizes[size]
                fail = f"{x['failures']}/{x['requests']}" + (f" ({x['errors'][0][:70]})" if x["errors"] else "")
                rows.append([name, mode.replace("_", "-"), size, x["first_tool_ms"], x["complete_ms"], x.get("cold_ms"),
                             x.get("repeat_ms"), pct(x["called"]), pct(x["gold"]), pct(x["args_valid"]), fail])
    out = md_table(["server", "mode", "tools", "first tool byte (ms)", "complete call (ms)", "first list (ms)",
                    "same list again (ms)", "called", "gold tool", "args valid", "failed"], rows)
    tp = [[n, s["throughput"]["clients"], s["throughput"]["requests"], s["throughput"]["wall_s"],
           s["throughput"]["requests_per_s"], s["throughput"]["failures"]] for n, s in r["servers"].items()]
    out += "\n\n" + md_table(["server", "clients (non-streamed)", "requests", "wall (s)", "requests/s", "failed"], tp)
    logged = [[n, e, c] for n, s in r["servers"].items() for e, c in (s.get("server_errors") or {}).items()]
    if logged:
        out += "\n\n" + md_table(["server", "logged error", "log lines"], logged)
    return out


def latency_figure(r: dict):
    """Median time to the complete tool call per tool-list size, per server and mode (a size where every request
    failed gets a red mark, never a zero)."""
    if not r.get("servers"):
        return None
    fig, ax = pyplot().subplots(figsize=(8, 5))
    failed: dict[int, list[str]] = {}
    for name, s in r["servers"].items():
        for mode, sizes in s["modes"].items():
            ns = sorted(sizes, key=int)
            pts = [(int(n), sizes[n]["complete_ms"]) for n in ns if sizes[n]["complete_ms"] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{name} {mode}: complete call")
            pts = [(int(n), sizes[n]["first_tool_ms"]) for n in ns if sizes[n]["first_tool_ms"] is not None]
            if pts and mode == "streamed":
                ax.plot(*zip(*pts), marker="x", linestyle="--", label=f"{name} {mode}: first tool-call byte")
            for n in ns:
                if sizes[n]["complete_ms"] is None:
                    failed.setdefault(int(n), []).append(f"{name} {mode.replace('_', '-')}")
    for n, who in failed.items():  # one mark per size listing every variant without a call
        ax.scatter([n], [50], marker="v", color="red", zorder=3)
        ax.annotate("no call:\n" + "\n".join(who), (n, 55), fontsize=6, color="red", ha="center", va="bottom")
    ax.set(xscale="log", yscale="log", xlabel="tools in the request", ylabel="ms (median)",
           title="Tool call over HTTP: nexus serve vs llama_cpp.server (same GGUF)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


FIGURES = (Figure("serve.png", latency_figure),)
