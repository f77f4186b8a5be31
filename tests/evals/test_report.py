"""`nexus eval all` on small real runs (scan and backends at --tiny size): JSON, plots and REPORT.md, then reuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEXUS = [sys.executable, "-m", "nexus_agent.cli", "eval", "all"]


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_THREADS": "1"}
    p = subprocess.run([*NEXUS, "--out", str(out), *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=1200)  # a hang guard, not a speed bound
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_eval_all_tiny_writes_report_and_reuses(tmp_path):
    from evals.benchmarks import benchmark

    out = tmp_path / "report"
    _run(out, "--only", "scan,backends", "--tiny")
    scan = json.loads((out / "scan.json").read_text())
    assert scan["report_meta"]["args"] == list(benchmark("scan").tiny_plan) and set(scan["sizes"]) == {"250", "2000"}
    backends = json.loads((out / "backends.json").read_text())
    assert backends["models"]["smollm2"]["backends"]["llamacpp"]["decode_tps"] > 0
    png = out / "scan_time.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    report = (out / "REPORT.md").read_text()
    assert "## SLB scan" in report and "![SLB scan](scan_time.png)" in report
    assert "## Backend speed" in report and "| llamacpp |" in report
    assert "nexus eval scan --sizes 250,2000 --repeats 20" in report  # the arguments are stated
    assert "## Not run yet" in report and "routing" in report.split("## Not run yet")[1]

    mtime = (out / "scan.json").stat().st_mtime_ns
    _run(out, "--only", "scan", "--reuse", "--tiny")
    assert (out / "scan.json").stat().st_mtime_ns == mtime  # reused, not re-run
    assert "![SLB scan](scan_time.png)" in (out / "REPORT.md").read_text()


def test_only_rejects_unknown_names():
    from evals.report import selected

    assert selected("scan, routing") == ["scan", "routing"]
    with pytest.raises(ValueError, match="unknown eval"):
        selected("scan,nope")
