"""The routing and scan evals write the JSON keys other tools read, on small real inputs."""

from __future__ import annotations

import argparse
import json

import pytest

from .conftest import QUERIES, TOOLS


def _args(module, argv):
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    a = p.parse_args(argv)
    a.json_out = None
    return a


def _data(tmp_path, tools=TOOLS):
    """(tools.jsonl, q.jsonl) paths in tmp_path holding `tools` and the labelled QUERIES."""
    t, q = tmp_path / "tools.jsonl", tmp_path / "q.jsonl"
    t.write_text("".join(json.dumps(x) + "\n" for x in tools))
    q.write_text("".join(json.dumps({"query": a, "gold_tool": g}) + "\n" for a, g in QUERIES))
    return t, q


def test_routing_eval_keys_and_no_fitting_on_scored_queries(tmp_path):
    import evals.routing as routing

    tools, queries = _data(tmp_path)
    irr = tmp_path / "irr.jsonl"
    irr.write_text(json.dumps({"query": "haha nice one", "gold_tool": None}) + "\n")
    # --calib is the scored set itself: nothing is left after removing scored queries -> cross-fitting
    res = routing.run(_args(routing, ["--tools", str(tools), "--queries", str(queries), "--calib", str(queries),
                                      "--irrelevant", str(irr), "--sizes", "4,12", "--reranker", "none",
                                      "--plot", str(tmp_path / "acc.png")]))
    assert res["cross_fit"] and res["calib_queries"] == 0
    for n in ("4", "12"):
        row = res["sizes"][n]
        for key in ("top1_embed", "top1_int8", "top1_routed", "auto_rate", "auto_precision", "none_precision",
                    "route_ms_p50", "top1_learned", "relevant_to_none", "route_ms_p99"):
            assert key in row
        assert 0 <= row["top1_learned"] <= 1 and row["relevant_to_none"] == row["none_rate_relevant"]
        assert 0.8 <= row["top1_embed"] <= 1 and abs(row["top1_int8"] - row["top1_embed"]) <= 1 / 12
    assert (tmp_path / "acc.png").stat().st_size > 5000


def test_routing_eval_takes_another_embedder_and_caches_each_apart(tmp_path, nexus_home):
    """--embedder: a model folder is embedded and cached under its own id, never served the packaged model's cache."""
    import evals.routing as routing
    from slb.embedder import packaged_minilm_path

    tools, queries = _data(tmp_path)
    argv = ["--tools", str(tools), "--queries", str(queries), "--sizes", "4", "--reranker", "none"]
    packaged = routing.run(_args(routing, argv))
    folder = routing.run(_args(routing, [*argv, "--embedder", str(packaged_minilm_path())]))
    assert packaged["embedder"].startswith("packaged:") and folder["embedder"].startswith("path:")
    assert len(list((nexus_home / "slb" / "eval-cache").glob("*.npy"))) == 2
    assert folder["sizes"]["4"]["top1_embed"] == packaged["sizes"]["4"]["top1_embed"]  # the same model's weights
    with pytest.raises(FileNotFoundError, match="nowhere"):
        routing.run(_args(routing, [*argv, "--embedder", str(tmp_path / "nowhere")]))


def test_routing_eval_reads_tools_with_descriptions_only(tmp_path):
    """MetaTool-style catalogues: name and description, no inputSchema."""
    import evals.routing as routing

    tools, queries = _data(tmp_path, [{"name": t["name"], "description": t["description"]} for t in TOOLS])
    res = routing.run(_args(routing, ["--tools", str(tools), "--queries", str(queries), "--sizes", "4",
                                      "--reranker", "none", "--examples", "template"]))
    row = res["sizes"]["4"]
    assert row["top1_embed"] >= 0.75 and 0 <= row["top1_learned"] <= 1 and res["catalogue_rows"] > len(TOOLS)


def test_scan_eval_keys():
    import evals.scan as scan_eval

    res = scan_eval.run(_args(scan_eval, ["--sizes", "250,2000", "--repeats", "20"]))
    for n in ("250", "2000"):
        assert res["sizes"][n]["numba_us_p50"] > 0 and res["sizes"][n]["numpy_f32_us_p50"] > 0
    grouped = scan_eval.run(_args(scan_eval, ["--sizes", "250", "--repeats", "20", "--rows-per-tool", "3"]))
    assert grouped["rows_per_tool"] == 3 and grouped["sizes"]["250"]["rows"] == 750
    assert grouped["sizes"]["250"]["numba_us_p50"] > 0


@pytest.mark.slow
def test_cross_fit_trains_one_reranker_per_fold_on_the_other_folds_queries(tmp_path, nexus_home):
    import evals.routing as routing
    from slb.reranker import reranker_meta

    tools, queries = _data(tmp_path)
    argv = ["--tools", str(tools), "--queries", str(queries), "--calib", str(queries), "--sizes", "12",
            "--train-steps", "2", "--k", "3", "--plot", str(tmp_path / "acc.png")]
    res = routing.run(_args(routing, argv))
    assert res["cross_fit"] and res["reranker_train_s"] > 0
    paths = res["reranker"]
    assert set(paths) == {0, 1} and paths[0] != paths[1]
    folds = [routing._fold(g) for _, g in QUERIES]
    for f in (0, 1):  # trained on the other fold's labelled queries only: never on the queries it scores
        assert reranker_meta(paths[f])["labelled"] == sum(1 for x in folds if x != f)
    again = routing.run(_args(routing, argv))
    assert again["reranker_train_s"] is None  # both reused from the Nexus home
