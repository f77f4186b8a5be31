"""Concurrency: threads routing over one SLB buffer and splicing from one block store give bit-identical results
to a single thread, and concurrent atomic writers never leave a torn file."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from registry.atomic import write_atomic
from registry.model import Tool
from slb.build import build_buffer
from slb.embedder import Embedder
from slb.service import open_router
from slb.tools import as_entry
from splice.block import load_block
from splice.compiler import block_key, block_path, compile_blocks
from splice.profile import SpliceProfile
from splice.prompt import preamble_tokens
from splice.splicer import splice_tool

ROOT = Path(__file__).resolve().parents[2]
THREADS = 4
TOOLS = [
    {"name": "get_weather", "description": "Get the weather forecast for a city.",
     "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "send_email", "description": "Send an email to a recipient with a subject.",
     "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"}}}},
    {"name": "set_timer", "description": "Start a countdown timer for some minutes.",
     "inputSchema": {"type": "object", "properties": {"minutes": {"type": "integer"}}}},
    {"name": "stock_price", "description": "Look up the trading price of a stock ticker.",
     "inputSchema": {"type": "object", "properties": {"ticker": {"type": "string"}}}},
]
QUERIES = ["Will it rain in Oslo?", "Email Ana the report", "Countdown 5 minutes", "AAPL price now?",
           "hello there", "weather tomorrow in Rome", "mail the team about lunch", "TSLA quote"] * 2


def _in_threads(fn, jobs):
    start = threading.Barrier(THREADS)

    def run(chunk):
        start.wait()  # all threads hit the shared file at the same moment
        return [fn(j) for j in chunk]

    chunks = [jobs[i::THREADS] for i in range(THREADS)]
    with ThreadPoolExecutor(THREADS) as ex:
        results = list(ex.map(run, chunks))
    out = {}
    for chunk, res in zip(chunks, results):
        out.update(zip(chunk, res))
    return [out[j] for j in jobs]


def test_threads_route_bit_identically(tmp_path, fault):
    f = fault("4 threads route over one buffer", "slb.router / slb.buffer", "decisions and scores bit-identical")
    build_buffer(TOOLS, Embedder(), tmp_path / "b.slb")
    router = open_router("gate", tools=[as_entry(t) for t in TOOLS], path=tmp_path / "b.slb")  # memory-mapped buffer
    key = lambda d: (d.tool, d.path, d.score, d.margin, tuple(d.as_dict().get("candidates", [])))  # noqa: E731
    single = [key(router.route(q)) for q in QUERIES]
    jobs = list(range(len(QUERIES)))
    threaded = _in_threads(lambda i: key(router.route(QUERIES[i])), jobs)
    assert threaded == single
    f.observe(f"{len(QUERIES)} queries x {THREADS} threads: identical to one thread")


SPLICE_TOOLS = [Tool.from_mcp({"name": f"t{i}", "description": f"Tool number {i} does thing {i}.",
                               "inputSchema": {"type": "object", "properties": {f"p{i}": {"type": "string"}}}})
                for i in range(4)]


def test_threads_splice_bit_identically(llamacpp_backend, fault):
    f = fault("4 threads splice from one block store", "splice.block / splicer", "same KV bytes as one thread")
    b = llamacpp_backend
    compile_blocks(b, SPLICE_TOOLS, progress=False)
    profile = SpliceProfile(backend=b.name, fingerprint=b.info.fingerprint, curve=[(1 << 20, 0)], max_depth=1 << 20)
    pre = preamble_tokens(b.tokenizer)

    def splice(i: int) -> bytes:
        tool = SPLICE_TOOLS[i % len(SPLICE_TOOLS)]
        _, kv = load_block(block_path(b, tool), block_key(b, tool))
        s = b.new_session(n_ctx=len(pre) + 256)
        try:
            s.prefill(pre)
            res = splice_tool(s, b, tool, depth=0, profile=profile)
            assert res.fallback is None and res.redecoded == 0
            out = s.export_kv(len(pre), s.n_past)
            return (out.blob if out.blob is not None else np.asarray(out.keys).tobytes()) + bytes(kv.blob or b"")
        finally:
            s.close()

    jobs = list(range(8))
    single = [splice(i) for i in jobs]
    assert _in_threads(splice, jobs) == single
    f.observe(f"{len(jobs)} splices x {THREADS} threads: identical bytes")


def test_concurrent_atomic_writers_never_tear(tmp_path, fault):
    f = fault("4 threads write one file at once", "registry.atomic", "the file is always one complete version")
    path = tmp_path / "shared.bin"
    versions = {i: bytes([i]) * (1 << 20) for i in range(THREADS)}
    seen: list[bytes] = []

    def write(i: int) -> None:
        for _ in range(5):
            write_atomic(path, versions[i])
            seen.append(path.read_bytes())

    _in_threads(write, list(range(THREADS)))
    assert all(s in versions.values() for s in seen) and path.read_bytes() in versions.values()
    assert [p.name for p in tmp_path.iterdir()] == ["shared.bin"]  # no temporary file left
    f.observe(f"{len(seen)} reads during {THREADS * 5} concurrent writes: all complete", lost=0)


WRITE_CALLS = re.compile(r"\.write_(text|bytes)\(|open\([^)]*['\"][wa]b?['\"]|np\.save|\.tofile\(")
# Files written on purpose without write_atomic, and why.
EXEMPT = {
    "nexus_agent/eviction/spill.py": "scratch spill file of one live session: created empty, appended, never reread "
                                     "after the process ends",
    "nexus_agent/trace.py": "append-only JSONL event log: one write per event, read by people, not by Nexus",
    "evals/report.py": "REPORT.md for people, regenerated wholesale by `nexus eval all` (never read back)",
    "evals/serve.py": "the peer server's stdout/stderr log, streamed by the subprocess, quoted in errors only",
    "evals/serve_load.py": "the served process's stdout/stderr log, streamed by the subprocess, quoted in errors only",
}


@pytest.mark.parametrize("folder", ["registry", "slb", "splice", "nexus_agent", "evals"])
def test_every_file_writer_is_atomic(folder):
    offenders = []
    for p in sorted((ROOT / folder).rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel in EXEMPT or rel == "registry/atomic.py":
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if WRITE_CALLS.search(line) and "write_atomic" not in line:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "write these through registry.atomic.write_atomic:\n" + "\n".join(offenders)
