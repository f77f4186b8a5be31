"""Every entry of evals.benchmarks.BENCHMARKS: its plans parse through the real `nexus eval` parser, its table and
figures render from the committed report JSON; and the data paths are explicit flags whose errors name the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.benchmarks import BENCHMARKS, SIZES, benchmark

REPORT = Path(__file__).resolve().parents[2] / "evals" / "report"
PNG = b"\x89PNG\r\n\x1a\n"


def test_names_are_unique():
    names = [b.name for b in BENCHMARKS]
    assert len(set(names)) == len(names) and "all" not in names


@pytest.mark.parametrize("bench", BENCHMARKS, ids=lambda b: b.name)
def test_plans_parse_through_the_cli(bench, routing_data):
    from nexus_agent.cli import build_parser

    parser = build_parser()
    for size in SIZES:
        argv = bench.plan_for(str(routing_data), size)
        assert not any("{data}" in a for a in argv)
        args = parser.parse_args(["eval", bench.name, *argv])
        assert args.eval_run is bench.run and args.json_out is None


@pytest.mark.parametrize("bench", BENCHMARKS, ids=lambda b: b.name)
def test_table_and_figures_render_from_the_committed_json(bench, tmp_path):
    from evals.render import save_figures

    r = json.loads((REPORT / f"{bench.name}.json").read_text())
    table = bench.table(r)
    assert table.startswith("| ") and table.count("\n|---") >= 1 and table.count("\n| ") >= 2
    assert save_figures(bench.figures, r, tmp_path) == [f.file for f in bench.figures]
    for f in bench.figures:
        png = tmp_path / f.file
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000


def test_plot_path_takes_the_first_figure_and_the_others_go_beside_it(tmp_path):
    from evals.render import save_plot

    r = json.loads((REPORT / "splice.json").read_text())
    path = tmp_path / "plots" / "mine.png"
    assert save_plot(benchmark("splice").figures, r, str(path)) == str(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["mine.png", "splice_ttft.png"]
    assert save_plot(benchmark("scan").figures, {}, str(tmp_path / "empty.png")) is None  # nothing to draw


def test_check_data_names_the_flag_and_the_missing_file(tmp_path, routing_data):
    from evals.report import check_data

    routing, agent, scan = benchmark("routing"), benchmark("agent"), benchmark("scan")
    check_data([scan], None, size="full")  # no plan reads the data folder: nothing to check
    check_data(BENCHMARKS, str(routing_data), size="full")
    check_data(BENCHMARKS, str(routing_data), size="tiny")
    check_data(BENCHMARKS, str(routing_data), size="quick")
    with pytest.raises(ValueError, match=r"^--data DIR is needed by routing, agent: "):
        check_data([scan, routing, agent], None, size="tiny")
    with pytest.raises(FileNotFoundError, match="--data .*: no such folder"):
        check_data([routing], str(tmp_path / "nope"), size="full")
    (tmp_path / "tools.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r": queries.jsonl is missing \(the routing plan reads it\)"):
        check_data([routing], str(tmp_path), size="full")
    (tmp_path / "queries.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r": queries_irrelevant.jsonl is missing \(the routing plan"):
        check_data([routing], str(tmp_path), size="full")
    check_data([routing], str(tmp_path), size="tiny")  # the tiny plan scores no irrelevant prompts
    check_data([agent], str(tmp_path), size="full")  # the agent plan reads tools.jsonl only


def test_eval_all_without_data_fails_before_running_anything(tmp_path, capsys):
    from nexus_agent.cli import main

    out = tmp_path / "report"
    assert main(["eval", "all", "--out", str(out), "--only", "scan,routing", "--tiny"]) == 1
    assert "--data DIR is needed by routing: " in capsys.readouterr().err
    assert not out.exists()  # scan did not run either


def test_eval_data_flags_are_explicit_and_errors_name_them(tmp_path, capsys):
    from nexus_agent.cli import main

    tools = tmp_path / "tools.jsonl"
    tools.write_text("")
    for name, flag, rest in (("routing", "--tools", ["--queries", str(tools)]),
                             ("routing", "--queries", ["--tools", str(tools)]),
                             ("agent", "--catalog", []), ("splice", "--tool-file", [])):
        with pytest.raises(SystemExit):
            main(["eval", name, *rest])
        assert f"the following arguments are required: {flag}" in capsys.readouterr().err
        assert main(["eval", name, *rest, flag, str(tmp_path / "none.jsonl")]) == 1
        assert f"{flag} {tmp_path / 'none.jsonl'}: no such file" in capsys.readouterr().err
    assert main(["eval", "routing", "--tools", str(tools), "--queries", str(tools),
                 "--irrelevant", str(tmp_path / "irr.jsonl")]) == 1
    assert f"--irrelevant {tmp_path / 'irr.jsonl'}: no such file" in capsys.readouterr().err


def test_committed_report_is_what_the_renderers_write(tmp_path):
    from evals.report import write_report

    for bench in BENCHMARKS:
        (tmp_path / f"{bench.name}.json").write_text((REPORT / f"{bench.name}.json").read_text())
    ours = write_report(tmp_path).read_text().splitlines()
    committed = (REPORT / "REPORT.md").read_text().splitlines()
    assert ours[0] == committed[0] and ours[2].startswith("Regenerated by `nexus eval all --out ")
    assert ours[3:] == committed[3:]  # all but the header line (output folder and commit)
