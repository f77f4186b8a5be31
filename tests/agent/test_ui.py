"""The agent's terminal output prints untrusted text (requests, tool names, results, problems) as written."""

from __future__ import annotations

from rich.console import Console as RichConsole

from nexus_agent.ui import Console


def test_events_with_markup_print_verbatim():
    ui = Console()
    ui.out = RichConsole(record=True, width=200, color_system=None)
    ui.event({"event": "route", "step": "add [red]x[/red]", "tool": "git_add[/b]", "path": "auto", "score": 0.5,
              "margin": 0.1, "route_ms": 0.2})
    ui.event({"event": "args", "source": "signature", "prompt_tokens": 10, "ttfat_ms": 3.0, "valid": False,
              "problem": "files: [str] expected"})
    ui.event({"event": "tool_call", "status": "ok", "tool": "[bold]t[/bold]", "elapsed_ms": 1.0,
              "text": "[link=x]result[/link]"})
    ui.event({"event": "full_schema", "why": "[i]why[/i]", "how": "splice", "fallback": "[u]fb[/u]"})
    out = ui.out.export_text()
    for piece in ("add [red]x[/red]", "git_add[/b]", "files: [str] expected", "[bold]t[/bold]",
                  "[link=x]result[/link]", "[i]why[/i]", "[u]fb[/u]"):
        assert piece in out, (piece, out)


def test_a_decision_prints_what_was_decided_by_whom_and_on_what_evidence():
    ui = Console()
    ui.out = RichConsole(record=True, width=200, color_system=None)
    ui.event({"event": "decide", "kind": "call", "how": "model", "calls": ["get_current_time", "git_log"],
              "p_call": 0.9032, "score": 1.726, "values": 1, "top1": 0.377, "margin": 0.0165, "vetoed": False,
              "rechecked": ["name"], "candidates": ["a", "b", "c"], "spliced": 2, "decide_ms": 812.4})
    ui.event({"event": "decide", "kind": "text", "how": "model", "calls": [], "p_call": 0.0011, "score": 0.4,
              "top1": 0.61, "margin": 0.2, "vetoed": True, "rechecked": [], "candidates": ["[b]x[/b]"],
              "spliced": 0, "decide_ms": 90.0})
    ui.event({"event": "decide", "kind": "text", "how": "model", "calls": [], "p_call": 0.99, "score": 2.56,
              "top1": 0.38, "margin": 0.02, "vetoed": False, "rechecked": [], "repeated": "convert_time",
              "candidates": ["convert_time"], "spliced": 2, "decide_ms": 1600.0})
    out = ui.out.export_text().splitlines()
    assert out[0] == ("decide → get_current_time, git_log model p(call)=0.90 score=+1.73 top1=0.38 margin=0.02 · "
                      "3 candidate(s), 2 block(s) spliced · 812 ms rechecked as text (name)"), out
    assert out[1] == ("decide → text model p(call)=0.00 score=+0.40 top1=0.61 margin=0.20 · 1 candidate(s) · 90 ms "
                      "vetoed: the model's near-certain no"), out
    assert out[2].endswith("convert_time again on no new part of the request"), out
