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
