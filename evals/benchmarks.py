"""Every benchmark, in one list: `nexus eval NAME`, `nexus eval all` and REPORT.md are built from BENCHMARKS.

An entry names an eval module's `add_arguments(parser)` and `run(args) -> dict` (the JSON-serialisable result),
its report section (title, blurb, `table(result) -> str`, the figures), and three argument lists for
`nexus eval all`: `plan` (the report's size), `quick_plan` (minutes per eval: `--quick`, for checking a change
against a baseline run) and `tiny_plan` (smoke size, seconds per eval, for tests). In a plan
`{data}` stands for the folder given as `nexus eval all --data DIR`. The list's order is the report's order.
Eval modules keep heavy imports (MLX, torch, llama.cpp) inside `run()`, so importing this list is cheap.

Adding an eval: write evals/NAME.py with `add_arguments`, `run`, `table` and `FIGURES`, and add its entry here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from evals import (
    agent,
    arguments,
    backends,
    decide,
    eviction,
    eviction_report,
    routing,
    scan,
    serve,
    serve_cold,
    splice,
)
from evals.render import Figure

SIZES = ("full", "quick", "tiny")

@dataclass(frozen=True)
class Benchmark:
    """One eval: how to run it, how its JSON is reported, and the arguments `nexus eval all` runs it with."""

    name: str  # `nexus eval NAME`, NAME.json in the report folder
    title: str  # REPORT.md section heading
    blurb: str  # the paragraph under the heading
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict]
    table: Callable[[dict], str]
    figures: tuple[Figure, ...]
    plan: tuple[str, ...]
    quick_plan: tuple[str, ...]
    tiny_plan: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name == "all":
            raise ValueError(f"benchmark name {self.name!r}: a Python identifier other than 'all' is expected")
        for size in SIZES:
            args = self.args(size)
            if isinstance(args, str) or not all(isinstance(a, str) for a in args):
                raise ValueError(f"benchmark {self.name}: its {size} plan must be a tuple of argument strings")

    def args(self, size: str = "full") -> tuple[str, ...]:
        """The raw plan of one size: "full" (the report's), "quick" or "tiny"."""
        if size not in SIZES:
            raise ValueError(f"plan size {size!r}: choose from {', '.join(SIZES)}")
        return {"full": self.plan, "quick": self.quick_plan, "tiny": self.tiny_plan}[size]

    def needs_data(self, size: str = "full") -> bool:
        """Whether the plan refers to `{data}` (so `nexus eval all` must be given --data DIR)."""
        return any("{data}" in a for a in self.args(size))

    def plan_for(self, data: str | None, size: str = "full") -> list[str]:
        """The plan's arguments with `{data}` replaced by `data`."""
        return [a.replace("{data}", data) if data is not None else a for a in self.args(size)]


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        name="backends", title="Backend speed",
        blurb="Prefill and decode throughput of our llama.cpp and MLX sessions against their peers on the same "
              "weights: llama-cpp-python's high-level `Llama` (same GGUF) and mlx-lm's own model class (an MLX "
              "folder of the same weights), same process, per packaged architecture. (x): ours / the peer.",
        add_arguments=backends.add_arguments, run=backends.run, table=backends.table, figures=(),
        plan=("--models", "smollm2,gemma3", "--lengths", "256,1024,4096", "--decode-tokens", "32", "--repeats", "2",
              "--backends", "llamacpp,mlx,llamacpp-highlevel,mlx-lm"),
        quick_plan=("--models", "smollm2,gemma3", "--lengths", "256,1024", "--decode-tokens", "32", "--repeats", "2",
                    "--backends", "llamacpp,mlx,llamacpp-highlevel,mlx-lm"),
        tiny_plan=("--lengths", "64", "--decode-tokens", "8", "--repeats", "1", "--backends", "llamacpp")),
    Benchmark(
        name="scan", title="SLB scan",
        blurb="Top-k scan over the INT8 embedding buffer (Numba) vs a float32 NumPy scan, one thread.",
        add_arguments=scan.add_arguments, run=scan.run, table=scan.table, figures=scan.FIGURES,
        plan=("--sizes", "250,1000,10000,100000", "--repeats", "100"),
        quick_plan=("--sizes", "250,1000,10000,100000", "--repeats", "100"),
        tiny_plan=("--sizes", "250,2000", "--repeats", "20")),
    Benchmark(
        name="routing", title="Routing",
        blurb="Top-1 accuracy of the semantic lookaside buffer as the registry grows (gold tool plus seeded "
              "distractors).",
        add_arguments=routing.add_arguments, run=routing.run, table=routing.table, figures=routing.FIGURES,
        plan=("--tools", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--sizes",
              "10,50,100,250,1000,2052", "--reranker", "none", "--irrelevant", "{data}/queries_irrelevant.jsonl"),
        quick_plan=("--tools", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--sizes", "10,50,250,1000",
                    "--reranker", "none", "--irrelevant", "{data}/queries_irrelevant.jsonl"),
        tiny_plan=("--tools", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--sizes", "10,50",
                   "--max-queries", "30", "--reranker", "none")),
    Benchmark(
        name="splice", title="Schema splicing",
        blurb="KL and top-1 agreement of a spliced schema block against a full prefill, and time to first token, "
              "per insertion depth and splice variant.",
        add_arguments=splice.add_arguments, run=splice.run, table=splice.table, figures=splice.FIGURES,
        plan=("--backend", "llamacpp,mlx", "--depths", "0,64,256,512,1024,2048", "--n-tools", "16",
              "--calib-tools", "4", "--calibrate", "--tool-file", "{data}/tools.jsonl"),
        quick_plan=("--backend", "llamacpp,mlx", "--depths", "0,256,1024", "--n-tools", "4", "--calib-tools", "2",
                    "--calibrate", "--tool-file", "{data}/tools.jsonl"),
        tiny_plan=("--backend", "llamacpp", "--depths", "0,64", "--n-tools", "1", "--calib-tools", "1",
                   "--tool-file", "{data}/tools.jsonl")),
    Benchmark(
        name="eviction", title="KV eviction",
        blurb="Relative attention-output error per policy and budget (offline replay on captured Q/K/V), the "
              "certified policy's certificate coverage, and fact recall.",
        add_arguments=eviction.add_arguments, run=eviction.run, table=eviction_report.table,
        figures=eviction_report.FIGURES,
        plan=("--quick",),
        quick_plan=("--quick",),
        tiny_plan=("--quick",)),
    Benchmark(
        name="agent", title="Agent",
        blurb="Argument generation through the signature path vs the concatenate-all-schemas baseline.",
        add_arguments=agent.add_arguments, run=agent.run, table=agent.table, figures=agent.FIGURES,
        plan=("--quick", "--sizes", "10,250", "--catalog", "{data}/tools.jsonl"),
        quick_plan=("--quick", "--sizes", "10,250", "--catalog", "{data}/tools.jsonl"),
        tiny_plan=("--quick", "--sizes", "10", "--tasks", "4", "--baseline-tasks", "1",
                   "--catalog", "{data}/tools.jsonl")),
    Benchmark(
        name="arguments", title="Argument accuracy (BFCL)",
        blurb="BFCL argument accuracy (AST-checker rules) with the gold tool given: free generation with the full "
              "schema in the prompt, schema-constrained decoding, and Nexus's copy-aware constrained decoding; "
              "and end to end, routed among 250 tools. Same model, same run.",
        add_arguments=arguments.add_arguments, run=arguments.run, table=arguments.table,
        figures=arguments.FIGURES,
        plan=("--data", "{data}/../arguments/arguments.jsonl", "--per-category", "12", "--sizes", "250",
              "--catalog", "{data}/tools.jsonl"),
        quick_plan=("--data", "{data}/../arguments/arguments.jsonl", "--quick", "--catalog", "{data}/tools.jsonl"),
        tiny_plan=("--data", "{data}/../arguments/arguments.jsonl", "--per-category", "1", "--sizes", "",
                   "--catalog", "{data}/tools.jsonl")),
    Benchmark(
        name="serve", title="Serving (`nexus serve`) side by side with the peers on the same weights",
        blurb="Tool calls over HTTP, streamed, on the packaged Qwen2.5-Coder-0.5B-Instruct GGUF, one core each: "
              "`nexus serve` against llama_cpp.server (the GGUF's own chat template, calls read from its text, "
              "n_ctx 32768) and mlx_lm.server (the GGUF as a float32 folder, its own tool parser), for `tools` "
              "lists of 10 to 1,000 catalogue tools (one list per size, as an agent sends); a 5-turn conversation "
              "with tool results between turns; 8 concurrent streaming clients. A peer's overflow, time-out or "
              "error is a failure.",
        add_arguments=serve.add_arguments, run=serve.run, table=serve.table, figures=serve.FIGURES,
        plan=("--catalog", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--sizes", "10,50,250,1000",
              "--requests", "3", "--peer-requests", "1", "--timeout", "450"),
        quick_plan=("--catalog", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--sizes", "10,50",
                    "--requests", "2", "--turns", "3", "--clients", "4"),
        tiny_plan=("--catalog", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--sizes", "10",
                   "--requests", "1", "--servers", "nexus", "--model", "smollm2", "--turns", "2", "--clients", "2")),
    Benchmark(
        name="serve_cold", title="Cold start of `nexus serve`",
        blurb="A tool list no server has seen (the first N catalogue tools in a fresh Nexus home): the first "
              "request, the same list again, and the first request after a restart on the same home (its "
              "embedding store). Targets: a cold 1,000-tool list ready in <= 10 s, after a restart <= 1 s.",
        add_arguments=serve_cold.add_arguments, run=serve_cold.run, table=serve_cold.table,
        figures=serve_cold.FIGURES,
        plan=("--catalog", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--cold-start", "250,1000"),
        quick_plan=("--catalog", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--cold-start", "250"),
        tiny_plan=("--catalog", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--cold-start", "10")),
    Benchmark(
        name="decide", title="Deciding: the router alone vs the model among the top k",
        blurb="Relevant requests, prompts no tool fits and conversational turns (evals/data/chat_turns.jsonl), "
              "each with a registry of N tools, through the `nexus serve` engine in process. `router`: the "
              "router decides alone (before this eval's issue); `topK`: the model decides among the router's top "
              "K shown in its template's tools section, neutral setting; `nexus`: the calibrated per-model "
              "setting `nexus serve` ships (2-fold cross-fitted). decision: right tool when one is wanted, no call "
              "otherwise.",
        add_arguments=decide.add_arguments, run=decide.run, table=decide.table, figures=decide.FIGURES,
        plan=("--tools", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--irrelevant",
              "{data}/queries_irrelevant.jsonl", "--sizes", "250", "--model", "qwen2.5-coder-0.5b", "--ks", "5",
              "--relevant", "48", "--n-irrelevant", "24", "--n-chat", "48", "--timed", "3", "--calibrate",
              "--n-ctx", "8192", "--seed", "1"),
        quick_plan=("--tools", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--irrelevant",
                    "{data}/queries_irrelevant.jsonl", "--sizes", "250", "--model", "qwen2.5-coder-0.5b",
                    "--ks", "5", "--relevant", "20", "--n-irrelevant", "10", "--n-chat", "20"),
        tiny_plan=("--tools", "{data}/tools.jsonl", "--queries", "{data}/queries.jsonl", "--irrelevant",
                   "{data}/queries_irrelevant.jsonl", "--sizes", "10", "--model", "smollm2", "--ks", "3",
                   "--relevant", "2", "--n-irrelevant", "1", "--n-chat", "2", "--timed", "1", "--n-ctx", "4096")),
]


def benchmark(name: str) -> Benchmark:
    """The entry called `name`; ValueError listing the known names otherwise."""
    for b in BENCHMARKS:
        if b.name == name:
            return b
    raise ValueError(f"unknown eval {name!r}; choose from {', '.join(b.name for b in BENCHMARKS)}")
