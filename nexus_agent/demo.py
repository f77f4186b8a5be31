"""`nexus demo`: the main job on the embedded defaults, end to end.

1. A streamed chat answer from the packaged SmolLM2 on each backend, with timings.
2. Register two bundled MCP servers (calculator, unit conversion: real stdio subprocesses), compile their
   schema KV blocks, and run a two-step agent task: route -> signature prompt -> schema-constrained arguments
   -> real MCP call, with the full-schema path spliced from a precompiled block where the signature is not enough.

The demo keeps its registry in `<NEXUS_HOME>/demo` so it never touches a user's own registrations.
"""

from __future__ import annotations

import argparse
import os
import sys

from native.registry import list_backends

DEMO_PROMPT = "In two sentences, why do AI agents need tools?"
DEMO_TASK = "Add 12 and 30, then convert 5 km to mi"
DEMO_SERVERS = ("calculator", "units")


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="the main job on the embedded defaults (generation + a multi-step agent task)")
    d.add_argument("--backend", choices=list_backends(text_only=False), default="llamacpp",
                   help="backend for the agent task")
    d.add_argument("--skip-generate", action="store_true", help="only run the agent task")
    d.set_defaults(func=run_demo)


def _banner(text: str) -> None:
    print(f"\n== {text} ==", flush=True)


def run_demo(args: argparse.Namespace) -> int:
    from native.cli import format_stats, stream_answer

    if not args.skip_generate:
        for backend in list_backends(text_only=False):
            _banner(f"{backend} · SmolLM2-135M-Instruct (packaged) · streamed chat")
            print(f"> {DEMO_PROMPT}\n", flush=True)
            print(format_stats(stream_answer(backend, None, [{"role": "user", "content": DEMO_PROMPT}], 64)))

    from registry.home import nexus_home

    os.environ["NEXUS_HOME"] = str(nexus_home() / "demo")
    from native import load_backend
    from nexus_agent.agent_cli import build_agent
    from registry.servers import command_for
    from registry.sources import register_server
    from registry.store import RegistryStore
    from splice.compiler import compile_stale

    _banner(f"registry · bundled MCP servers {', '.join(DEMO_SERVERS)} (stdio subprocesses)")
    with RegistryStore() as store:
        for name in DEMO_SERVERS:
            report = register_server(command_for(name), store)
            print(f"{name}: {len(report.added)} added, {len(report.unchanged)} unchanged, "
                  f"{len(report.rejected)} rejected")
        backend = load_backend(args.backend)
        paths = compile_stale(backend, store)
        print(f"compiled {len(paths)} stale schema KV block(s) for {backend.name}")
    _banner(f"agent · {args.backend} · nexus run {DEMO_TASK!r}")
    agent, ui = build_agent(backend=backend, backend_name=args.backend)
    try:
        ui.done(agent.run_turn(DEMO_TASK))
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(0)
