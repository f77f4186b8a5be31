"""Backend speed: prefill tokens/s at several lengths and decode tokens/s, per model, for our llama.cpp session,
our MLX session and their peers on the same weights, all in one process: llama-cpp-python's high-level `Llama`
on the same GGUF, and mlx-lm's own model class and `generate_step` on an MLX folder of the same weights
(`nexus convert`: float32, as our MLX backend runs them on a CPU).

Runs are interleaved per length (peers and ours) and each figure is the median of `--repeats` runs, so a
noisy neighbour hits all alike. Thread counts are the same for both llama.cpp paths.
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


PEERS = {"llamacpp": "llamacpp-highlevel", "mlx": "mlx-lm"}  # our backend -> the peer it is measured against


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="smollm2",
                   help="comma-separated GGUF files or packaged model names (smollm2; gemma3 where its package is "
                        "installed); one table per model")
    p.add_argument("--lengths", default="256,1024,4096", help="prefill lengths in tokens")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--backends", default="llamacpp,mlx,llamacpp-highlevel,mlx-lm")


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


class _MLXLM:
    """mlx-lm's model class (`mlx_lm.utils.load_model`) on an MLX folder of the same weights, driven by its own
    `generate_step` (prefill in its default steps, then decode with its asynchronous evaluation)."""

    def __init__(self, folder):
        from mlx_lm.utils import load_model

        self.model, _ = load_model(folder)

    def _steps(self, ids: list[int], n: int):
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        return generate_step(mx.array(ids), self.model, max_tokens=n, sampler=lambda lp: mx.argmax(lp, axis=-1))

    def prefill(self, ids: list[int]) -> float:
        t = time.perf_counter()
        next(self._steps(ids, 1))  # the prompt's forward pass and the first token
        return time.perf_counter() - t

    def decode(self, ids: list[int], n: int) -> float:
        steps = self._steps(ids, n + 1)
        next(steps)
        t = time.perf_counter()
        for _ in steps:
            pass
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
        """n decode steps through our one decode loop (`generate_step`, greedy), after an untimed prefill."""
        from native.generate import Sampler, SamplerConfig, generate_step

        s = self.backend.new_session(self.n_ctx)
        logits = s.prefill(ids)
        t = time.perf_counter()
        for _ in generate_step(s, ids, Sampler(SamplerConfig()), n + 1, logits=logits):
            pass  # n + 1 tokens sampled, n decoded (the last one is not)
        dt = time.perf_counter() - t
        s.close()
        return dt


def run(args: argparse.Namespace) -> dict:
    result = {"models": {}}
    for name in args.models.split(","):
        result["models"][name] = run_model(name, args)
    return result


def run_model(path: str, args: argparse.Namespace) -> dict:
    import tempfile
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from native import load_backend
    from native.convert import convert
    from native.llamacpp_backend import LlamaCppBackend

    lengths = [int(x) for x in args.lengths.split(",")]
    names = args.backends.split(",")
    n_ctx = max(lengths) + args.decode_tokens + 64
    lc = LlamaCppBackend(path)
    tok = lc.tokenizer
    runners, tmp = {}, None
    for name in names:
        if name == "llamacpp":
            runners[name] = _Ours(lc, n_ctx)
        elif name == "mlx":
            runners[name] = _Ours(load_backend("mlx", path), n_ctx)
        elif name == "llamacpp-highlevel":
            runners[name] = _HighLevel(lc.info.path, n_ctx, lc.n_threads, lc.n_threads_batch)
        elif name == "mlx-lm":
            tmp = tempfile.TemporaryDirectory(prefix="nexus-mlx-folder-")
            runners[name] = _MLXLM(convert(path, Path(tmp.name)))
        else:
            raise ValueError(f"unknown backend {name!r} in --backends")
    result = {"model": lc.info.path, "architecture": lc.info.architecture, "fingerprint": lc.info.fingerprint,
              "threads": [lc.n_threads, lc.n_threads_batch],
              "backends": {n: {"prefill_tps": {}, "decode_tps": None} for n in names}}
    console = Console()
    console.print(f"[bold]{lc.info.path}[/bold] ({lc.info.architecture})")
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
    if tmp is not None:
        tmp.cleanup()

    table = Table(title="Backend speed (tokens/s, median of repeats; same process, same weights; (x): vs the peer)")
    table.add_column("backend")
    for n in lengths:
        table.add_column(f"prefill {n}", justify="right")
    table.add_column("decode", justify="right")
    bs = result["backends"]
    for name in names:
        b, peer = bs[name], bs.get(PEERS.get(name, ""))
        cells = []
        for n in lengths:
            v = b["prefill_tps"][str(n)]
            cells.append(f"{v:.1f}" + (f" ({v / peer['prefill_tps'][str(n)]:.2f}x)" if peer else ""))
        table.add_row(name, *cells, f"{b['decode_tps']:.1f}" + (f" ({b['decode_tps'] / peer['decode_tps']:.2f}x)"
                                                                  if peer else ""))
    console.print(table)
    for ours, peer in PEERS.items():
        if ours in bs and peer in bs:
            ratios = [bs[ours]["prefill_tps"][str(n)] / bs[peer]["prefill_tps"][str(n)] for n in lengths]
            ratios.append(bs[ours]["decode_tps"] / bs[peer]["decode_tps"])
            result[f"{ours}_vs_{peer}_min_ratio"] = min(ratios)
            console.print(f"our {ours} session vs {peer}: worst ratio {min(ratios):.3f} (target >= 0.90)")
    return result


def table(r: dict) -> str:
    """Markdown: per model, prefill tokens/s per length and decode tokens/s, one row per backend, with the ratio
    of ours to its peer (llama.cpp: llama-cpp-python's `Llama`; MLX: mlx-lm)."""
    rows, lengths = [], sorted({n for m in r["models"].values() for b in m["backends"].values()
                                for n in b["prefill_tps"]}, key=int)

    def cell(value, peer_value):
        return f"{value:.1f}" if peer_value is None else f"{value:.1f} ({value / peer_value:.2f}x)"

    for label, m in r["models"].items():
        bs = m["backends"]
        for name, b in bs.items():
            peer = bs.get(PEERS.get(name, ""))
            rows.append([f"{label} ({m['architecture']})", name,
                         *[cell(b["prefill_tps"][n], peer and peer["prefill_tps"][n]) if n in b["prefill_tps"]
                           else None for n in lengths],
                         cell(b["decode_tps"], peer and peer["decode_tps"])])
    return md_table(["model", "backend", *[f"prefill {n} (tok/s)" for n in lengths], "decode (tok/s)"], rows)
