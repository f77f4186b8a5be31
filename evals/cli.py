"""`nexus eval NAME ...`: one subcommand per entry of evals.benchmarks.BENCHMARKS, plus `nexus eval all`.

Each subcommand takes the benchmark's own arguments and `--json OUT`; this layer prints nothing itself and writes
the result when asked. `nexus eval all` (evals/report.py) runs every benchmark at report size, then REPORT.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from registry.atomic import write_atomic


def write_json(result: dict, out: str | None) -> None:
    if not out:
        return
    path = Path(out)
    write_atomic(path, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")


def register(sub: argparse._SubParsersAction) -> None:
    from evals import report
    from evals.benchmarks import BENCHMARKS

    p = sub.add_parser("eval", help="run a benchmark (tables, JSON, plots)")
    evals = p.add_subparsers(dest="eval_name", metavar="NAME", required=True)
    for bench in BENCHMARKS:
        q = evals.add_parser(bench.name, help=f"see `nexus eval {bench.name} --help`")
        q.add_argument("--json", dest="json_out", metavar="OUT", help="write the result as JSON to OUT")
        q.set_defaults(func=_run, eval_run=bench.run)
        bench.add_arguments(q)
    q = evals.add_parser("all", help="see `nexus eval all --help`")
    q.add_argument("--json", dest="json_out", metavar="OUT", help="write the result as JSON to OUT")
    q.set_defaults(func=_run, eval_run=report.run)
    report.add_arguments(q)


def _run(args: argparse.Namespace) -> int:
    write_json(args.eval_run(args), args.json_out)
    return 0
