"""The `nexus` command line: a thin argparse layer over the library APIs.

Each package contributes its commands through a `register(subparsers)` function in its own `cli.py`, listed
in COMMAND_MODULES; handlers import heavy dependencies (MLX, llama.cpp, torch) lazily so `nexus --help` is fast.
A handler is stored as `func` on the parsed namespace and returns a process exit code (or None for 0).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "native.cli",  # generate, convert
    "registry.cli",  # register, tools, servers
    "slb.cli",  # route, slb
    "splice.cli",  # compile, splice
    "nexus_agent.agent_cli",  # run, chat, doctor, mcp, serve
    "nexus_agent.demo",  # demo
    "evals.cli",  # eval <name>
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nexus", description="Local runtime for agentic LLMs with many MCP tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # a package whose commands do not exist yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from native.base import BackendError, ModelError

    try:
        code = args.func(args)
    except (ModelError, BackendError, ValueError, FileNotFoundError) as e:
        print(f"nexus {args.command}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # disk full, file too large, permission: nothing half-written is left (atomic writes)
        where = f" writing {e.filename}" if e.filename else ""
        print(f"nexus {args.command}: error{where}: {e.strerror or e}; free disk space (or fix permissions) and "
              "run the command again: files written before the failure are complete and kept", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
