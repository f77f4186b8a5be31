"""`nexus run "task"`, `nexus chat`, `nexus doctor`, `nexus mcp`, `nexus serve`: a thin layer over the
library APIs (nexus_agent.session.open_agent, nexus_agent.gateway, nexus_agent.server)."""

from __future__ import annotations

import argparse
import sys

from native.registry import list_backends

TEMPLATE_HELP = "a chat template (a Jinja file, or its text) rendered instead of the model's own"


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="run one agent task over the registered MCP tools")
    r.add_argument("task")
    _agent_args(r)
    r.set_defaults(func=_run)
    c = sub.add_parser("chat", help="interactive agent session (empty line or Ctrl-D to quit)")
    _agent_args(c)
    c.set_defaults(func=_chat)
    d = sub.add_parser("doctor", help="check installation, model, llguidance, registry, buffer, blocks and servers")
    d.add_argument("--backend", choices=list_backends(text_only=False), default="llamacpp")
    d.add_argument("--no-servers", action="store_true", help="do not start the registered MCP servers")
    d.add_argument("--model", default=None, help="GGUF file, MLX model folder or packaged name (default smollm2)")
    d.add_argument("--chat-template", default=None, metavar="FILE", help=TEMPLATE_HELP)
    d.set_defaults(func=_doctor)
    m = sub.add_parser("mcp", help="serve Nexus as one MCP server (find_tools, call_tool) in front of every "
                       "registered server: stdio, or --http")
    m.add_argument("--http", action="store_true", help="serve streamable HTTP at http://HOST:PORT/mcp")
    m.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    m.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one, printed on stderr)")
    m.add_argument("--list-limit", type=int, default=20,
                   help="also list the registered tools by name when there are at most this many (default 20)")
    m.add_argument("--route-mode", choices=("gate", "embed", "rerank"), default="gate")
    m.set_defaults(func=_mcp)
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions) over the agent")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY on /v1 routes")
    s.add_argument("--model", default=None, help="GGUF file, MLX model folder or packaged name (default smollm2)")
    s.add_argument("--chat-template", default=None, metavar="FILE", help=TEMPLATE_HELP)
    s.add_argument("--backend", choices=list_backends(text_only=False), default="llamacpp")
    s.add_argument("--kv-budget", type=int, default=None, metavar="TOKENS", help="KV budget per conversation")
    s.add_argument("--n-ctx", type=int, default=8192, help="tokens per live context (default 8192)")
    s.add_argument("--contexts", type=int, default=2, help="conversation contexts kept for prefix reuse")
    s.add_argument("--max-body-mb", type=float, default=8.0, help="larger request bodies get HTTP 413")
    s.add_argument("--no-idle-compile", action="store_true",
                   help="do not compile a new tool list's schema blocks between requests")
    s.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    s.set_defaults(func=_serve)


def _agent_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=list_backends(), default="llamacpp", help="model backend")
    p.add_argument("--model", default=None, help="GGUF file or MLX model folder (default: packaged SmolLM2)")
    p.add_argument("--chat-template", default=None, metavar="FILE", help=TEMPLATE_HELP)
    p.add_argument("--trace", default=None, metavar="FILE", help="append a JSONL trace of the session to FILE")
    p.add_argument("--max-steps", type=int, default=4, help="tool calls per turn (default 4)")
    p.add_argument("--max-arg-tokens", type=int, default=160)
    p.add_argument("--max-tokens", type=int, default=96, help="answer tokens per turn")
    p.add_argument("--kv-budget", type=int, default=None, metavar="TOKENS", help="live KV cache budget")
    p.add_argument("--eviction", default="certified", help="eviction policy name (default certified)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before a tool call is abandoned")
    p.add_argument("--route", choices=("gate", "embed", "rerank"), default="gate", help="router mode")
    p.add_argument("--no-answer", action="store_true", help="stop after the tool calls (no final answer)")
    p.add_argument("--quiet", action="store_true", help="print only the answer")


def _open(args):
    return build_agent(args.backend, args.model, args.route, args.trace, args.max_steps, args.max_arg_tokens,
                       args.max_tokens, not args.no_answer, args.kv_budget, args.eviction, args.timeout, args.quiet,
                       chat_template=args.chat_template)


def build_agent(backend_name: str = "llamacpp", model: str | None = None, route: str = "gate", trace: str | None = None,
                max_steps: int = 4, max_arg_tokens: int = 160, max_tokens: int = 96, answer: bool = True,
                kv_budget: int | None = None, eviction: str = "certified", timeout: float = 20.0, quiet: bool = False,
                backend=None, chat_template: str | None = None):
    """An agent over the home registry plus its rich console; the library call behind run, chat and demo."""
    from nexus_agent.loop import AgentConfig
    from nexus_agent.memory import MemoryConfig
    from nexus_agent.servers import ServerPoolConfig
    from nexus_agent.session import SessionConfig, open_agent
    from nexus_agent.ui import Console

    ui = Console(quiet=quiet)
    agent = open_agent(
        SessionConfig(backend_name, model, route, trace, chat_template),
        AgentConfig(max_steps=max_steps, max_arg_tokens=max_arg_tokens, max_answer_tokens=max_tokens, answer=answer),
        MemoryConfig(kv_budget, eviction), ServerPoolConfig(call_timeout_s=timeout),
        on_text=ui.text, on_event=ui.event, backend=backend,
    )
    return agent, ui


def _run(args: argparse.Namespace) -> int:
    agent, ui = _open(args)
    try:
        result = agent.run_turn(args.task)
        ui.done(result)
    finally:
        agent.close()
    return 0


def _chat(args: argparse.Namespace) -> int:
    agent, ui = _open(args)
    try:
        while True:
            try:
                line = input("\n> ")
            except EOFError:
                break
            if not line.strip():
                break
            ui.done(agent.run_turn(line))
    finally:
        agent.close()
    return 0


def _serve(args: argparse.Namespace) -> int:
    from nexus_agent.serve_engine import EngineConfig
    from nexus_agent.server import ServeConfig, serve

    engine = EngineConfig(args.backend, args.model, args.n_ctx, args.kv_budget, args.contexts,
                          compile_idle=not args.no_idle_compile, chat_template=args.chat_template)
    return serve(ServeConfig(args.host, args.port, args.api_key, int(args.max_body_mb * (1 << 20)), args.log_level,
                             engine))


def _doctor(args: argparse.Namespace) -> int:
    from nexus_agent.doctor import run_checks

    ok = True
    for name, passed, detail in run_checks(args.backend, servers=not args.no_servers, model=args.model,
                                           chat_template=args.chat_template):
        ok &= passed
        print(f"[{'ok' if passed else 'FAIL'}] {name}: {detail}")
    return 0 if ok else 1


def _mcp(args: argparse.Namespace) -> int:
    from nexus_agent.gateway import GatewayConfig, serve

    serve(GatewayConfig(list_limit=args.list_limit, route_mode=args.route_mode), args.http, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(0)
