"""`nexus serve` side by side with the servers a user would pick for the same weights, over HTTP, streamed.

One run starts each server in turn as a subprocess on a free 127.0.0.1 port (one thread each; run the eval under
`/tmp/heavy` or `taskset` so they share one core) and kills it by PID at the end; every server serves the same
GGUF (default the packaged Qwen2.5-Coder-0.5B-Instruct):
- `nexus`: `nexus serve --model GGUF` (the model decides among the router's candidates; n_ctx 8192 is enough: it
  never shows every tool). Its NEXUS_HOME is a fresh folder, so the first request of a size embeds its tools.
- `llama_cpp`: llama-cpp-python's server (`native.llamacpp_peer`) with no `--chat_format`, so it formats chats with
  the GGUF's own template (`chat_template.default`), which renders `tools`; it does not parse calls, so the call
  is read from the streamed text (`evals.serve_calls.parse_text_call`). n_ctx 32768, the model's limit.
- `mlx_lm`: mlx-lm's server (`native.mlx_peer`: OpenBLAS bound, the GGUF as a float32 folder cached in the Nexus
  home); it renders tools with the tokenizer's chat template and parses Qwen's calls into `delta.tool_calls`.
Both peers keep a prompt cache (llama.cpp the last prompt's tokens, mlx-lm an LRU of prompts), so the first
request of a size is their cold prefill and the later ones reuse the tools prefix: both are reported.

Requests are public routing queries with their gold tool among N catalogue tools (N = 10 / 50 / 250 / 1000; all
requests of a size send the same list, as an agent does: their gold tools among distractors of that size's own),
`tool_choice: "auto"`, `stream: true`, temperature 0. A peer prompt whose tokens (the
GGUF's template and tokenizer) plus max_tokens exceed n_ctx is an overflow failure and is not sent. Per request:
ms to the first byte of the tool call and to its last byte, right tool, arguments valid against the tool's schema,
or the failure's kind (`evals.serve_calls.FAILURES`, or `timeout` after --timeout s: the server is then restarted
so later requests do not queue behind it). Then a conversation of --turns user turns over one tool list, a tool
result after each call (each server continues its own conversation), and --clients concurrent streaming clients.
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
import tempfile
import threading
import time
from pathlib import Path

from evals import serve_cold
from evals.serve_calls import FAILURES, chat_request
from evals.serve_report import FIGURES, _ms, table, targets

__all__ = ["FIGURES", "add_arguments", "chat_request", "run", "table"]

READY_TIMEOUT_S = 300
SERVERS = ("nexus", "llama_cpp", "mlx_lm")
SYSTEM = "You are a helpful assistant. Call a function when one fits the request."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", required=True, metavar="FILE", help="JSONL of MCP tools (the public tools.jsonl)")
    p.add_argument("--queries", required=True, metavar="FILE", help="JSONL of {query, gold_tool} (queries.jsonl)")
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="GGUF or packaged name every server serves")
    p.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated, of {', '.join(SERVERS)}")
    p.add_argument("--sizes", default="10,50,250,1000")
    p.add_argument("--requests", type=int, default=3, help="queries per size (default 3)")
    p.add_argument("--peer-requests", type=int, default=None, metavar="N",
                   help="queries per size for the peers at 250 tools or more (default --requests)")
    p.add_argument("--n-ctx", type=int, default=32768, help="the peers' context (default 32768, Qwen2.5's limit)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--turns", type=int, default=5, help="user turns in the conversation (0: none)")
    p.add_argument("--conversation-size", type=int, default=10, help="tools in the conversation's list")
    p.add_argument("--clients", type=int, default=8, help="concurrent streaming clients (0: none)")
    p.add_argument("--client-requests", type=int, default=1, help="requests per concurrent client")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (then a 'timeout' failure)")
    p.add_argument("--idle", type=float, default=0.0, metavar="S",
                   help="nexus: after an untimed first request of a size's list, wait up to S s while the server "
                        "compiles the list's blocks between requests, then time the requests (0: no wait)")
    p.add_argument("--same-queries", action="store_true",
                   help="every size sends the same requests (their gold tools among that size's own distractors): "
                        "the growth with the tool count, not with the queries; default: each size its own queries")
    p.add_argument("--no-peer", action="store_true", help="measure nexus serve only (same as --servers nexus)")
    p.add_argument("--seed", type=int, default=0)
    serve_cold.add_cold_start_argument(p, default="")  # e.g. --cold-start 1000: JSON "cold_start" (evals.serve_cold)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], port: int, log: Path, env: dict) -> subprocess.Popen:
    """Start a server and wait until its /v1/models answers."""
    with open(log, "ab") as out:
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


def _command(name: str, gguf: str, port: int, args) -> list[str]:
    py, host = sys.executable, ["--host", "127.0.0.1", "--port", str(port)]
    if name == "nexus":
        return [py, "-m", "nexus_agent.cli", "serve", "--port", str(port), "--max-body-mb", "64", "--model", gguf]
    if name == "llama_cpp":  # no --chat_format: the GGUF's own template; a new request waits
        return [py, "-m", "native.llamacpp_peer", "--model", gguf, "--n_ctx", str(args.n_ctx), "--n_threads", "1",
                "--n_threads_batch", "1", "--interrupt_requests", "False", *host]  # queue, never cancel, a request
    if name == "mlx_lm":
        return [py, "-m", "native.mlx_peer", "--model", gguf, "--max-tokens", str(args.max_tokens), *host]
    raise ValueError(f"unknown server {name!r} in --servers; choose from {', '.join(SERVERS)}")


class Server:
    """One server under test: started, restarted after a timed-out request, stopped by PID."""

    def __init__(self, name: str, gguf: str, args, folder: Path, env: dict):
        self.name, self.gguf, self.args, self.env = name, gguf, args, env
        self.log, self.proc, self.port, self.restarts = folder / f"{name}.log", None, None, 0
        self.model = "default_model" if name == "mlx_lm" else gguf  # mlx_lm loads any other name it is sent

    def start(self) -> Server:
        self.port = _free_port()
        self.proc = _start(_command(self.name, self.gguf, self.port, self.args), self.port, self.log, self.env)
        if self.name == "nexus":  # it serves its model under the name /v1/models lists
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            c.request("GET", "/v1/models")
            self.model = json.loads(c.getresponse().read())["data"][0]["id"]
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def send(self, body: dict, tokens: int | None) -> dict:
        """One request; a peer prompt over the context is an overflow, not sent; a time-out restarts the server."""
        if self.name != "nexus" and tokens is not None and tokens + self.args.max_tokens > self.args.n_ctx:
            return {"failure": "overflow", "error": f"{tokens} prompt tokens + {self.args.max_tokens} > n_ctx "
                    f"{self.args.n_ctx}", "first_tool_ms": None, "complete_ms": None, "end_ms": None,
                    "tool": None, "arguments": None, "parsed": None}
        r = chat_request(self.port, dict(body, model=self.model), self.args.timeout)
        if r["failure"] == "timeout":
            self.stop()
            self.restarts += 1
            self.start()
        return r


def _valid(args_text: str | None, schema: dict | None) -> bool:
    import jsonschema

    if args_text is None or schema is None:
        return False
    try:
        jsonschema.validate(json.loads(args_text), schema)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def _openai_tool(t) -> dict:
    return {"type": "function", "function": {"name": t.name, "description": t.description,
                                             "parameters": t.input_schema}}


def _tool_list(rng, distractors: list[str], golds: list[str], tools: dict) -> list[dict]:
    """The golds at random places among the distractors, as OpenAI tools."""
    names = list(distractors)
    for g in golds:
        names.insert(int(rng.integers(0, len(names) + 1)), g)
    return [_openai_tool(tools[n]) for n in names]


def _workload(args) -> tuple[dict[int, list[dict]], dict, dict]:
    """Per size: requests (query, gold, tool list), every request of a size with the same list of N tools (its
    queries' gold tools among distractors of its own), as an agent sends the same tools with every request; the
    conversation (its turns' queries and golds, one list of --conversation-size tools); and every tool by name."""
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
    groups, rest = [], iter(queries)
    for n in [args.requests] * (1 if args.same_queries else len(sizes)) + [args.turns]:  # distinct golds in a list
        group: list[dict] = []
        for q in rest:
            if len(group) == n:
                break
            if q["gold_tool"] not in {g["gold_tool"] for g in group}:
                group.append(q)
        groups.append(group)
    if args.same_queries:  # every size asks the first group's queries, among its own distractors
        groups = groups[:1] * len(sizes) + groups[-1:]
    if any(len({q["gold_tool"] for q in g}) > n for g, n in zip(groups, sizes + [args.conversation_size])):
        raise ValueError(f"--requests {args.requests} / --turns {args.turns} exceed a list's size ({args.sizes})")
    golds = {q["gold_tool"] for g in groups for q in g}
    pool = [n for n in rng.permutation(sorted(tools)) if n not in golds]
    counts = [size - len(g) for size, g in zip(sizes, groups)] + [args.conversation_size - len(groups[-1])]
    if sum(counts) > len(pool):
        raise ValueError(f"sizes {args.sizes} need {sum(counts)} distractors; the catalogue has {len(pool)}")
    lists, start = [], 0
    for group, n in zip(groups, counts):
        lists.append(_tool_list(rng, pool[start:start + n], [q["gold_tool"] for q in group], tools))
        start += n
    plan = {size: [{"query": q["query"], "gold": q["gold_tool"], "tools": lst} for q in group]
            for size, group, lst in zip(sizes, groups, lists)}
    conversation = {"turns": [{"query": q["query"], "gold": q["gold_tool"]} for q in groups[-1]], "tools": lists[-1]}
    return plan, conversation, tools


def _body(messages: list[dict], tools: list[dict], max_tokens: int) -> dict:
    return {"messages": messages, "tools": tools, "tool_choice": "auto", "stream": True,
            "max_tokens": max_tokens, "temperature": 0}


class _Tokens:
    """Prompt tokens as the GGUF's own template and tokenizer count them (what a peer prefills)."""

    def __init__(self, gguf: str):
        from native.tokenizer import load_tokenizer

        self.tok = load_tokenizer(gguf)

    def __call__(self, messages: list[dict], tools: list[dict]) -> int:
        plain = [{k: v for k, v in m.items() if k != "tool_calls"} | {"content": m.get("content") or ""}
                 for m in messages]  # a count: the calls' few tokens are left out
        return len(self.tok.encode_chat(plain, tools=tools))


def _row(r: dict, gold: str, tools: dict, tokens: int | None) -> dict:
    schema = tools[r["tool"]].input_schema if r["tool"] in tools else None
    return {k: r.get(k) for k in ("first_tool_ms", "complete_ms", "end_ms", "tool", "arguments", "parsed",
                                  "failure", "error")} | {"n_calls": len(r.get("calls") or []),
        "gold": gold, "right": r["tool"] == gold, "valid": _valid(r["arguments"], schema), "prompt_tokens": tokens,
        "text": (r.get("content") or "")[:300] if r["parsed"] == "text" or r["failure"] in ("no_call", "bad_json")
        else None}


def _p(vals: list[float], q: float) -> float | None:
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return None
    return round(vals[min(len(vals) - 1, int(round(q * (len(vals) - 1))))], 1) if q != 0.5 else \
        round(statistics.median(vals), 1)


def _summary(rows: list[dict]) -> dict:
    n, calls = len(rows), [r for r in rows if r["failure"] is None]  # a call with arguments that parse
    kinds = {k: sum(r["failure"] == k for r in rows) for k in FAILURES}
    return {"requests": n, "call_ms_p50": _p([r["complete_ms"] for r in calls], 0.5),
            "first_byte_ms_p50": _p([r["first_tool_ms"] for r in calls], 0.5),
            "first_call_ms": rows[0]["complete_ms"] if rows else None,
            "tool_acc": sum(r["right"] for r in rows) / n if n else None,
            "args_valid": sum(r["valid"] for r in rows) / n if n else None,
            "failed": sum(kinds.values()), "failures": {k: v for k, v in kinds.items() if v},
            "errors": sorted({r["error"][:160] for r in rows if r["error"]})[:3],
            "prompt_tokens": _p([r["prompt_tokens"] for r in rows], 0.5)}


def _idle_wait(srv: Server, tools: list[dict], limit: float) -> dict:
    """An untimed request with `tools` (a greeting), then /v1/nexus/stats polled until the server has compiled
    the list's blocks or `limit` s passed: how long it took and what was left."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello!"}]
    srv.send(_body(messages, tools, 16), None)
    t0 = time.perf_counter()
    while True:
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        c.request("GET", "/v1/nexus/stats")
        blocks = json.loads(c.getresponse().read()).get("blocks") or {"pending": 0}
        if not blocks["pending"] or time.perf_counter() - t0 > limit:
            return {"idle_s": round(time.perf_counter() - t0, 1), "blocks_pending": blocks["pending"]}
        time.sleep(2.0)


def _measure_sizes(srv: Server, plan: dict, tools: dict, count, args) -> dict:
    out = {}
    for size, rows in plan.items():
        if srv.name != "nexus" and size >= 250 and args.peer_requests is not None:
            rows = rows[:args.peer_requests]
        idle = _idle_wait(srv, rows[0]["tools"], args.idle) if srv.name == "nexus" and args.idle else {}
        if idle:
            print(f"  {srv.name} {size} tools: blocks compiled while idle in {idle['idle_s']} s, "
                  f"{idle['blocks_pending']} pending", file=sys.stderr, flush=True)
        done = []
        for row in rows:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["query"]}]
            tokens = count(messages, row["tools"])
            r = srv.send(_body(messages, row["tools"], args.max_tokens), tokens)
            done.append(_row(r, row["gold"], tools, tokens))
            print(f"  {srv.name} {size} tools ({tokens} tokens): {r['tool']} (gold {row['gold']}) first byte "
                  f"{_ms(r['first_tool_ms'])} ms, call {_ms(r['complete_ms'])} ms, {r['failure'] or 'ok'} "
                  f"{r['error'] or ''}", file=sys.stderr, flush=True)
        out[str(size)] = _summary(done) | idle | {"rows": done}
    return out


def _result_message(k: int, r: dict) -> list[dict]:
    """The assistant's reply as a conversation turn, then a result for each call it made, as an agent sends them
    (content "" rather than None beside a call: llama_cpp.server's request model refuses None)."""
    calls = [c for c in r.get("calls") or [] if c[0]] or ([[r["tool"], r["arguments"]]] if r["tool"] else [])
    if not calls:
        return [{"role": "assistant", "content": r.get("content") or ""}]
    ids = [f"call_{k}_{i}" for i in range(len(calls))]
    return [{"role": "assistant", "content": "", "tool_calls": [
                {"id": i, "type": "function", "function": {"name": name, "arguments": args or "{}"}}
                for i, (name, args) in zip(ids, calls)]}] + [
            {"role": "tool", "tool_call_id": i,
             "content": json.dumps({"status": "ok", "tool": name, "result": f"done (step {k + 1})"})}
            for i, (name, _) in zip(ids, calls)]


def _conversation(srv: Server, conv: dict, tools: dict, count, args) -> dict:
    """Each user turn sent with the conversation so far (this server's own calls and their results): per turn, ms
    to the end of the reply; the total."""
    messages, turns = [{"role": "system", "content": SYSTEM}], []
    for k, turn in enumerate(conv["turns"]):
        messages.append({"role": "user", "content": turn["query"]})
        tokens = count(messages, conv["tools"])
        r = srv.send(_body(messages, conv["tools"], args.max_tokens), tokens)
        turns.append(_row(r, turn["gold"], tools, tokens))
        print(f"  {srv.name} turn {k + 1} ({tokens} tokens): {r['tool']} (gold {turn['gold']}) "
              f"{_ms(r['end_ms'])} ms {r['failure'] or 'ok'}", file=sys.stderr, flush=True)
        messages += _result_message(k, r)
    ends = [t["end_ms"] for t in turns]
    return {"total_ms": round(sum(ends), 1) if all(e is not None for e in ends) else None,
            "turn_ms": [e and round(e, 1) for e in ends], "tool_acc": sum(t["right"] for t in turns) / len(turns),
            "failed": sum(t["failure"] is not None for t in turns), "rows": turns}


def _concurrent(srv: Server, rows: list[dict], tools: dict, count, args) -> dict:
    """`clients` threads at once, each sending `client_requests` streamed requests over the smallest size's lists."""
    done: list[dict] = []

    def client(i: int) -> None:
        for j in range(args.client_requests):
            row = rows[(i + j) % len(rows)]
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["query"]}]
            tokens = count(messages, row["tools"])
            r = chat_request(srv.port, dict(_body(messages, row["tools"], args.max_tokens), model=srv.model),
                             args.timeout)
            done.append(_row(r, row["gold"], tools, tokens))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = _summary(done)
    return {"clients": args.clients, "wall_s": round(time.perf_counter() - t0, 2),
            "call_ms_p99": _p([r["complete_ms"] for r in done if r["failure"] is None], 0.99)} | {
        k: s[k] for k in ("requests", "call_ms_p50", "first_byte_ms_p50", "tool_acc", "args_valid", "failed",
                          "failures", "errors")} | {"rows": done}


def run(args: argparse.Namespace) -> dict:
    for flag, path in (("--catalog", args.catalog), ("--queries", args.queries)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    from native.model_files import resolve_model

    names = ["nexus"] if args.no_peer else [n for n in args.servers.split(",") if n]
    for n in names:
        if n not in SERVERS:
            raise ValueError(f"unknown server {n!r} in --servers; choose from {', '.join(SERVERS)}")
    gguf = resolve_model(args.model).path
    plan, conv, tools = _workload(args)
    count = _Tokens(gguf)
    env = dict(os.environ, NEXUS_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = {"model": os.path.basename(gguf), "sizes": sorted(plan), "requests": args.requests, "idle": args.idle,
              "same_queries": args.same_queries,
              "peer_requests": args.peer_requests, "n_ctx": args.n_ctx, "seed": args.seed, "servers": {},
              "conversation": {}, "concurrent": {}, "restarts": {}, "server_errors": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:  # nexus starts with an empty home: its first request of a size embeds the tools
            own = {"nexus": {"NEXUS_HOME": tmp}, "mlx_lm": {"HF_HUB_CACHE": tmp}}.get(name, {})  # mlx_lm's
            srv = Server(name, gguf, args, Path(tmp), env | own)  # /v1/models fails without a Hugging Face cache
            srv.start()
            try:
                result["servers"][name] = _measure_sizes(srv, plan, tools, count, args)
                if conv["turns"]:
                    result["conversation"][name] = _conversation(srv, conv, tools, count, args)
                if args.clients:
                    result["concurrent"][name] = _concurrent(srv, plan[min(plan)], tools, count, args)
            finally:
                srv.stop()
            result["restarts"][name] = srv.restarts
            result["server_errors"][name] = server_errors(srv.log)
    if args.cold_start:  # nexus serve alone: a new tool list, then a restart on the same home
        result["cold_start"] = serve_cold.run(args)["cold_start"]
    result["targets"] = targets(result)
    print(table(result))
    return result


def server_errors(log: Path) -> dict[str, int]:
    """The exceptions a server logged, with how often: a server that drops a stream says why only in its log."""
    import re

    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^(?:\s*\|\s*)?([A-Za-z_.]*(?:Error|Exception)): (.+)$", line)
        if m:
            key = re.sub(r"\(\d+\)", "(N)", f"{m.group(1)}: {m.group(2)}")[:200]
            counts[key] = counts.get(key, 0) + 1
    return counts
