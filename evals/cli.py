"""`nexus eval NAME ...`: one entry per benchmark module.

A benchmark module defines `add_arguments(parser)` and `run(args) -> dict` (the JSON-serialisable result); this
layer adds `--json OUT`, prints nothing itself, and writes the result when asked.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from registry.atomic import write_atomic

# name -> module; the module's docstring first line is the help text.
EVALS: dict[str, str] = {
    "backends": "evals.backends",
    "eviction": "evals.eviction",
    "routing": "evals.routing",
    "scan": "evals.scan",
    "agent": "evals.agent",
    "splice": "evals.splice",
    "all": "evals.report",  # every eval at report size, then REPORT.md (evals/report.py)
}


def _help(module_name: str) -> str:
    return f"see `nexus eval {module_name.rsplit('.', 1)[-1]} --help`"


def write_json(result: dict, out: str | None) -> None:
    if not out:
        return
    path = Path(out)
    write_atomic(path, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="run a benchmark (tables, JSON, plots)")
    evals = p.add_subparsers(dest="eval_name", metavar="NAME", required=True)
    for name, module_name in EVALS.items():
        q = evals.add_parser(name, help=_help(module_name))
        q.add_argument("--json", dest="json_out", metavar="OUT", help="write the result as JSON to OUT")
        q.set_defaults(func=_run, eval_module=module_name)
        # Eval modules keep heavy imports (MLX, torch, llama.cpp) inside run(), so this import is cheap.
        importlib.import_module(module_name).add_arguments(q)


def _run(args: argparse.Namespace) -> int:
    module = importlib.import_module(args.eval_module)
    result = module.run(args)
    write_json(result, args.json_out)
    return 0
