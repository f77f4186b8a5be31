"""Backend speed: prefill tokens/s at several lengths and decode tokens/s, for our llama.cpp session, our MLX
session, and llama-cpp-python's high-level `Llama` on the same GGUF as the baseline, all in one process.

Runs are interleaved per length (baseline, then ours) and each figure is the median of `--repeats` runs, so a
noisy neighbour hits all three alike. Thread counts are the same for both llama.cpp paths.
"""

from __future__ import annotations

import argparse
import statistics
import time

from evals.render import md_table

TEXT = (
    "Agents call tools through MCP servers. Each tool has a JSON schema with typed parameters, a description and "
    "an optional output schema. The runtime routes a request to the right tool, fills in the arguments, calls the "
    "server and reads the result back into the conversation. Numbers like 3.14159, 2048 and 1e-5 appear too. "
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file (default: packaged SmolLM2-135M Q4_1)")
    p.add_argument("--lengths", default="256,1024,4096", help="prefill lengths in tokens")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--backends", default="llamacpp,mlx,llamacpp-highlevel")


def _prompt(tokenizer, n: int) -> list[int]:
    ids = tokenizer.encode(TEXT)
    return (ids * (n // len(ids) + 1))[:n]


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        times.append(fn())
    return statistics.median(times)


class _HighLevel:
    """llama-cpp-python's `Llama` driven through its own eval loop."""

    def __init__(self, path: str, n_ctx: int, n_threads: int, n_threads_batch: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=n_threads,
                         n_threads_batch=n_threads_batch, verbose=False)

    def prefill(self, ids: list[int]) -> float:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()
        t = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t

    def decode(self, ids: list[int], n: int) -> float:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()
        self.llm.eval(ids)
        tok = ids[-1]
        t = time.perf_counter()
        for _ in range(n):
            self.llm.eval([tok])
            tok = int(self.llm.scores[self.llm.n_tokens - 1].argmax())
        return time.perf_counter() - t


class _Ours:
    def __init__(self, backend, n_ctx: int):
        self.backend, self.n_ctx = backend, n_ctx

    def prefill(self, ids: list[int]) -> float:
        s = self.backend.new_session(self.n_ctx)
        t = time.perf_counter()
        s.prefill(ids)
        dt = time.perf_counter() - t
        s.close()
        return dt

    def decode(self, ids: list[int], n: int) -> float:
        s = self.backend.new_session(self.n_ctx)
        logits = s.prefill(ids)
        t = time.perf_counter()
        for _ in range(n):
            logits = s.decode(int(logits.argmax()))
        dt = time.perf_counter() - t
        s.close()
        return dt


def run(args: argparse.Namespace) -> dict:
    from rich.console import Console
    from rich.table import Table

    from native import load_backend
    from native.llamacpp_backend import LlamaCppBackend

    lengths = [int(x) for x in args.lengths.split(",")]
    names = args.backends.split(",")
    n_ctx = max(lengths) + args.decode_tokens + 64
    lc = LlamaCppBackend(args.model)
    tok = lc.tokenizer
    runners = {}
    for name in names:
        if name == "llamacpp":
            runners[name] = _Ours(lc, n_ctx)
        elif name == "mlx":
            runners[name] = _Ours(load_backend("mlx", args.model), n_ctx)
        elif name == "llamacpp-highlevel":
            runners[name] = _HighLevel(lc.info.path, n_ctx, lc.n_threads, lc.n_threads_batch)
        else:
            raise ValueError(f"unknown backend {name!r} in --backends")
    result = {"model": lc.info.path, "fingerprint": lc.info.fingerprint, "threads": [lc.n_threads, lc.n_threads_batch],
              "backends": {n: {"prefill_tps": {}, "decode_tps": None} for n in names}}
    console = Console()
    for n in lengths:
        ids = _prompt(tok, n)
        for name, r in runners.items():
            dt = _median_time(lambda: r.prefill(ids), args.repeats)
            result["backends"][name]["prefill_tps"][str(n)] = n / dt
            console.print(f"prefill {n:>5} tokens  {name:<20} {n / dt:8.1f} tok/s")
    ids = _prompt(tok, 128)
    for name, r in runners.items():
        dt = _median_time(lambda: r.decode(ids, args.decode_tokens), args.repeats)
        result["backends"][name]["decode_tps"] = args.decode_tokens / dt
        console.print(f"decode {args.decode_tokens} tokens   {name:<20} {args.decode_tokens / dt:8.1f} tok/s")

    table = Table(title="Backend speed (tokens/s, median of repeats; same process, same GGUF)")
    table.add_column("backend")
    for n in lengths:
        table.add_column(f"prefill {n}", justify="right")
    table.add_column("decode", justify="right")
    base = result["backends"].get("llamacpp-highlevel")
    for name in names:
        b = result["backends"][name]
        cells = []
        for n in lengths:
            v = b["prefill_tps"][str(n)]
            ratio = f" ({v / base['prefill_tps'][str(n)]:.2f}x)" if base and name != "llamacpp-highlevel" else ""
            cells.append(f"{v:.1f}{ratio}")
        ratio = f" ({b['decode_tps'] / base['decode_tps']:.2f}x)" if base and name != "llamacpp-highlevel" else ""
        table.add_row(name, *cells, f"{b['decode_tps']:.1f}{ratio}")
    console.print(table)
    if base and "llamacpp" in names:
        ours = result["backends"]["llamacpp"]
        ratios = [ours["prefill_tps"][str(n)] / base["prefill_tps"][str(n)] for n in lengths]
        ratios.append(ours["decode_tps"] / base["decode_tps"])
        result["llamacpp_vs_highlevel_min_ratio"] = min(ratios)
        console.print(f"our llama.cpp session vs high-level Llama: worst ratio {min(ratios):.3f} (target >= 0.90)")
    return result


def table(r: dict) -> str:
    """Markdown: prefill tokens/s per length and decode tokens/s, one row per backend."""
    bs = r["backends"]
    lengths = sorted({n for b in bs.values() for n in b["prefill_tps"]}, key=int)
    return md_table(["backend", *[f"prefill {n} (tok/s)" for n in lengths], "decode (tok/s)"],
                    [[k, *[b["prefill_tps"].get(n) for n in lengths], b["decode_tps"]] for k, b in bs.items()])
