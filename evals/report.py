"""Run every eval at a report size and write REPORT.md with tables and plots (`nexus eval all --out DIR`).

Each eval of evals.benchmarks.BENCHMARKS runs in this process through its own `add_arguments`/`run` with the
entry's `plan` (`--quick`: its `quick_plan`, minutes per eval; `--tiny`: its `tiny_plan`, a smoke size for
tests), and its JSON goes to DIR/NAME.json. Plans
that read the public routing data take its folder from `--data DIR`. The report is then written from every
NAME.json present in DIR, so a long run can be split: `--only scan,routing` runs just those, `--reuse` keeps
JSON already in DIR instead of re-running it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from evals.benchmarks import BENCHMARKS, SIZES, Benchmark, benchmark
from evals.cli import write_json
from evals.render import save_figures


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = ",".join(b.name for b in BENCHMARKS)
    readers = ", ".join(b.name for b in BENCHMARKS if any(b.needs_data(size) for size in SIZES))
    p.add_argument("--out", default="evals/report", help="folder for NAME.json, the PNG plots and REPORT.md")
    p.add_argument("--only", default=None, help=f"comma-separated evals to run (default: all of {names})")
    p.add_argument("--reuse", action="store_true", help="keep NAME.json already in --out instead of re-running")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="each eval's quick plan (minutes per eval: compare a change against a baseline run)")
    size.add_argument("--tiny", action="store_true", help="smoke-size arguments (seconds per eval; for tests)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="the public routing data folder (tools.jsonl, queries.jsonl, queries_irrelevant.jsonl); "
                        f"needed by the plans that read it ({readers})")


def run_eval(bench: Benchmark, argv: list[str], out: Path) -> dict:
    """Run `nexus eval NAME argv` in-process; write out/NAME.json (with the arguments and wall time) and return it."""
    parser = argparse.ArgumentParser(prog=f"nexus eval {bench.name}")
    bench.add_arguments(parser)
    args = parser.parse_args(argv)
    args.json_out = str(out / f"{bench.name}.json")
    t0 = time.perf_counter()
    result = bench.run(args)
    result["report_meta"] = {"args": argv, "wall_s": round(time.perf_counter() - t0, 1),
                             "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json(result, args.json_out)
    return result


def selected(only: str | None) -> list[str]:
    known = [b.name for b in BENCHMARKS]
    names = [n.strip() for n in only.split(",") if n.strip()] if only else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown eval(s) in --only: {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def check_data(benches: list[Benchmark], data: str | None, size: str) -> None:
    """Before any eval runs: ValueError naming --data when a plan reads the data folder and none is given,
    FileNotFoundError when the folder or a file a plan names in it (`{data}/FILE`) is absent."""
    needy = [b.name for b in benches if b.needs_data(size)]
    if not needy:
        return
    if data is None:
        raise ValueError(f"--data DIR is needed by {', '.join(needy)}: the public routing data folder (tools.jsonl, "
                         "queries.jsonl, queries_irrelevant.jsonl)")
    if not Path(data).is_dir():
        raise FileNotFoundError(f"--data {data}: no such folder")
    for b in benches:
        for raw, arg in zip(b.args(size), b.plan_for(data, size)):
            if raw.startswith("{data}/") and not Path(arg).is_file():
                raise FileNotFoundError(f"--data {data}: {raw[len('{data}/'):]} is missing (the {b.name} plan "
                                        "reads it)")


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("NEXUS_THREADS", "1")  # 2 shared cores: never oversubscribe (DESIGN §3)
    out = Path(args.out)
    benches = [benchmark(n) for n in selected(args.only)]
    reused = {b.name for b in benches if args.reuse and (out / f"{b.name}.json").exists()}
    size = plan_size(args)
    check_data([b for b in benches if b.name not in reused], args.data, size)
    out.mkdir(parents=True, exist_ok=True)
    status = {}
    for bench in benches:
        if bench.name in reused:
            status[bench.name] = "reused"
            continue
        argv = bench.plan_for(args.data, size)
        print(f"== nexus eval {bench.name} {' '.join(argv)}", flush=True)
        run_eval(bench, argv, out)
        status[bench.name] = "ran"
    report = write_report(out)
    print(f"wrote {report}")
    return {"out": str(out), "report": str(report), "status": status, "size": size, "tiny": size == "tiny"}


def plan_size(args: argparse.Namespace) -> str:
    """The plan size `nexus eval all` was asked for: "tiny", "quick" or "full"."""
    return "tiny" if args.tiny else "quick" if args.quick else "full"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_report(out: Path) -> Path:
    """REPORT.md from every NAME.json in `out` (plots regenerated from the JSON); returns its path."""
    parts = ["# Nexus evaluation report", "",
             f"Regenerated by `nexus eval all --out {out}/` (commit {_git_commit()}, {platform.machine()}, "
             f"{os.cpu_count()} CPUs, NEXUS_THREADS={os.environ.get('NEXUS_THREADS', 'default')}). Each section "
             "states the arguments its eval ran with; rerun one with `nexus eval all --only NAME` (the others' JSON "
             "is kept and reported).", ""]
    missing = []
    for bench in BENCHMARKS:
        name = bench.name
        path = out / f"{name}.json"
        if not path.exists():
            missing.append(bench)
            continue
        r = json.loads(path.read_text())
        meta = r.get("report_meta") or {}
        if meta:
            ran = (f"`nexus eval {name} {' '.join(meta.get('args', []))}` — {meta.get('wall_s', '?')} s, "
                   f"finished {meta.get('finished', '?')}." + (f" ({meta['note']})" if meta.get("note") else ""))
        else:  # NAME.json written by `nexus eval NAME --json` directly: no timing was recorded
            ran = f"Run directly as `nexus eval {name} {' '.join(bench.plan_for('DIR'))}` (wall time not recorded)."
        parts += [f"## {bench.title}", "", bench.blurb, "", ran, ""]
        try:
            parts += [bench.table(r), ""]
        except (KeyError, TypeError, ValueError) as e:
            parts += [f"(table unavailable: {name}.json lacks {e})", ""]
        for png in save_figures(bench.figures, r, out):
            parts += [f"![{bench.title}]({png})", ""]
    if missing:
        data = " --data DIR" if any(b.needs_data() for b in missing) else ""
        parts += ["## Not run yet", "", ", ".join(b.name for b in missing) + f": run `nexus eval all --out {out}/ "
                  f"--only {','.join(b.name for b in missing)}{data}`.", ""]
    report = out / "REPORT.md"
    report.write_text("\n".join(parts))
    return report
