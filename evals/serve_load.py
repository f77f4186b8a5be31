"""`nexus serve` under load: N concurrent streaming clients for a fixed time, some dropping mid-stream.

    python -m evals.serve_load --catalog DIR/tools.jsonl --seconds 120 --clients 8 --json out/serve_load.json

Starts `nexus serve` as a subprocess on a free 127.0.0.1 port (one thread), then runs `--clients` threads that
each send streamed requests back to back until `--seconds` have passed: in turn a short text answer and a tool
call among 50 tools (`add` among 49 catalogue tools; its arguments must join into `{"a": 12, "b": 30}`-shaped
valid JSON). Every `--drop-every`-th request of a client closes its connection after the third SSE event (a
client that goes away). Per request: time to the first SSE event and to `[DONE]`; a request fails when its
status is not 200, the stream ends without a finish_reason or `[DONE]`, carries an error event, or a streamed
call's arguments do not parse and validate. At the end `/v1/nexus/stats` must show no job, active generation or
queued request left, and the dropped requests among the cancelled ones. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-load"
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers and return their sum.",
                                        "parameters": {"type": "object", "properties": {
                                            "a": {"type": "number"}, "b": {"type": "number"}},
                                            "required": ["a", "b"]}}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", required=True, metavar="FILE", help="JSONL of MCP tools (the public tools.jsonl)")
    p.add_argument("--seconds", type=float, default=120.0, help="how long the clients send requests")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--drop-every", type=int, default=5, help="every Nth request of a client drops mid-stream")
    p.add_argument("--model", default=None, help="nexus serve --model (default: the packaged SmolLM2)")
    p.add_argument("--seed", type=int, default=0, help="offsets which request each client starts with")
    p.add_argument("--json", default=None, metavar="OUT")


def _tools(catalog: str, n: int) -> list[dict]:
    from registry.model import Tool

    out = []
    for line in Path(catalog).read_text().splitlines():
        t = json.loads(line)
        if t["name"] == "add":
            continue
        try:
            Tool.from_mcp(t)
        except ValueError:
            continue
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                     "parameters": t["inputSchema"]}})
        if len(out) == n:
            break
    return out


def _get(port: int, path: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def start_server(model: str | None, log: Path) -> tuple[subprocess.Popen, int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), NEXUS_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "nexus_agent.cli", "serve", "--port", str(port), "--api-key", KEY, "--n-ctx", "4096"]
    if model:
        cmd += ["--model", model]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nexus serve exited with {proc.returncode}; see {log}")
        try:
            if _get(port, "/health").get("status") == "ok":
                return proc, port
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"nexus serve not ready in 300 s; see {log}")


def one_request(port: int, body: dict, drop: bool) -> dict:
    """Stream one request: {"ms", "first_ms", "kind", "failed": None or why}."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    out = {"kind": "call" if body.get("tools") else "text", "dropped": drop, "failed": None, "first_ms": None}
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(dict(body, stream=True)),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        if resp.status != 200:
            out["failed"] = f"HTTP {resp.status}"
            return out
        events = []
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            if out["first_ms"] is None:
                out["first_ms"] = (time.perf_counter() - t0) * 1e3
            events.append(line[6:].strip().decode())
            if drop and len(events) >= 3:
                conn.sock.close()
                return out
        out["failed"] = _check(events, body)
    except OSError as e:
        out["failed"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        out["ms"] = (time.perf_counter() - t0) * 1e3
    return out


def _check(events: list[str], body: dict) -> str | None:
    if not events or events[-1] != "[DONE]":
        return "no [DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    if any("error" in c for c in chunks):
        return "error event: " + next(json.dumps(c["error"])[:80] for c in chunks if "error" in c)
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    finishes = [c["finish_reason"] for c in choices if c["finish_reason"]]
    if len(finishes) != 1:
        return f"finish reasons {finishes}"
    if finishes[0] == "tool_calls":
        args = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks
                       if c.get("choices") and c["choices"][0]["delta"].get("tool_calls"))
        try:
            value = json.loads(args)
        except ValueError:
            return f"arguments not JSON: {args[:60]!r}"
        if not isinstance(value, dict) or not all(isinstance(value.get(k), (int, float)) for k in ("a", "b")):
            return f"arguments invalid: {args[:60]!r}"
    return None


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def run(args: argparse.Namespace) -> dict:
    log = Path(args.json or "serve_load.json").with_suffix(".server.log")
    tools = _tools(args.catalog, 49) + [ADD]
    bodies = [{"model": "m", "messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 24},
              {"model": "m", "messages": [{"role": "user", "content": "Add 12 and 30"}], "tools": tools}]
    proc, port = start_server(args.model, log)
    try:
        model = _get(port, "/v1/models")["data"][0]["id"]
        for b in bodies:
            b["model"] = model
        rows: list[dict] = []
        lock = threading.Lock()
        stop_at = time.monotonic() + args.seconds

        def client(i: int) -> None:
            k = i + args.seed
            while time.monotonic() < stop_at:
                r = one_request(port, bodies[k % 2], args.drop_every > 0 and (k + 1) % args.drop_every == 0)
                r["client"] = i
                with lock:
                    rows.append(r)
                k += 1

        t0 = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(client, range(args.clients)))
        wall = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while (stats := _get(port, "/v1/nexus/stats"))["jobs"] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    answered = [r for r in rows if not r["dropped"]]
    ok = [r for r in answered if r["failed"] is None]
    failures: dict[str, int] = {}
    for r in answered:
        if r["failed"]:
            failures[r["failed"]] = failures.get(r["failed"], 0) + 1
    out = {"clients": args.clients, "seconds": args.seconds, "wall_s": round(wall, 1), "seed": args.seed,
           "requests": len(answered), "dropped": len(rows) - len(answered), "failed": len(answered) - len(ok),
           "failures": failures, "calls": sum(r["kind"] == "call" for r in ok),
           "ms_p50": _pct([r["ms"] for r in ok], 0.5), "ms_p99": _pct([r["ms"] for r in ok], 0.99),
           "first_event_ms_p50": _pct([r["first_ms"] for r in ok if r["first_ms"]], 0.5),
           "first_event_ms_p99": _pct([r["first_ms"] for r in ok if r["first_ms"]], 0.99),
           "by_kind": {k: {"n": sum(r["kind"] == k for r in ok),
                           "ms_p50": _pct([r["ms"] for r in ok if r["kind"] == k], 0.5),
                           "ms_p99": _pct([r["ms"] for r in ok if r["kind"] == k], 0.99)} for k in ("text", "call")},
           "stats_after": {k: stats.get(k) for k in ("jobs", "active", "queued", "requests", "cancelled", "failed")}}
    out["leaked"] = bool(stats["jobs"] or stats["active"] or stats["queued"])
    return out


def table(r: dict) -> str:
    rows = [("requests answered", r["requests"]), ("dropped mid-stream", r["dropped"]), ("failed", r["failed"]),
            ("latency p50 / p99 (ms)", f"{r['ms_p50']} / {r['ms_p99']}"),
            ("first event p50 / p99 (ms)", f"{r['first_event_ms_p50']} / {r['first_event_ms_p99']}"),
            ("text p50 / p99 (ms)", f"{r['by_kind']['text']['ms_p50']} / {r['by_kind']['text']['ms_p99']}"),
            ("tool call p50 / p99 (ms)", f"{r['by_kind']['call']['ms_p50']} / {r['by_kind']['call']['ms_p99']}"),
            ("server after: jobs / active / queued", f"{r['stats_after']['jobs']} / {r['stats_after']['active']} / "
                                                      f"{r['stats_after']['queued']}"),
            ("server after: cancelled / failed", f"{r['stats_after']['cancelled']} / {r['stats_after']['failed']}")]
    head = f"{r['clients']} streaming clients for {r['seconds']:.0f} s (wall {r['wall_s']} s)"
    return "\n".join([f"| {head} | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.serve_load", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    r = run(args)
    print(table(r))
    if r["failures"]:
        print("failures:", json.dumps(r["failures"], indent=1))
    if args.json:
        from registry.atomic import write_atomic

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json, json.dumps(r, indent=1))
    return 1 if r["failed"] or r["leaked"] else 0


if __name__ == "__main__":
    sys.exit(main())
