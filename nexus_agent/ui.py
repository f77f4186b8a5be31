"""Streamed terminal output for the agent with rich: routes, arguments as they are decoded, tool results."""

from __future__ import annotations

from rich.console import Console as RichConsole
from rich.markup import escape


class Console:
    """Receives the agent's trace events and streamed text; `quiet` prints only the answer."""

    def __init__(self, quiet: bool = False):
        self.out = RichConsole(highlight=False)
        self.quiet = quiet
        self._kind = None

    def text(self, kind: str, piece: str) -> None:
        if self.quiet and kind != "answer":
            return
        if kind != self._kind:
            self._kind = kind
            if kind == "answer":
                self.out.print("\n[bold]answer[/bold] ", end="")
            else:
                self.out.print("  [dim]args[/dim] ", end="")
        self.out.print(piece, end="", markup=False, highlight=False)

    def event(self, e: dict) -> None:
        if self.quiet:
            return
        kind = e["event"]
        if kind == "route":
            tool = escape(e["tool"] or "(no tool)")
            self.out.print(f"[cyan]route[/cyan] {escape(repr(e['step']))} → [bold]{tool}[/bold] "
                           f"[dim]{e['path']} score={e['score']:.2f} margin={e['margin']:.2f} "
                           f"{e['route_ms']:.0f} ms[/dim]")
        elif kind == "decide":
            self._decide(e)
        elif kind == "args":
            self._kind = None
            mark = "[green]valid[/green]" if e["valid"] else f"[red]invalid[/red]: {escape(str(e['problem']))}"
            self.out.print(f"\n  [dim]{e['source']} · {e['prompt_tokens']} prompt tokens · first argument token "
                           f"{e['ttfat_ms']:.0f} ms ·[/dim] {mark}")
        elif kind == "full_schema":
            self.out.print(f"  [yellow]full schema[/yellow] ({escape(str(e.get('why')))}): {escape(str(e['how']))}"
                           + (f" [dim]({escape(str(e['fallback']))})[/dim]" if e.get("fallback") else ""))
        elif kind == "tool_call":
            style = "green" if e["status"] == "ok" else "red"
            text = e["text"] if len(e["text"]) < 300 else e["text"][:300] + "…"
            self.out.print(f"  [{style}]{escape(e['status'])}[/{style}] {escape(e['tool'])} "
                           f"[dim]{e['elapsed_ms']:.0f} ms[/dim]: ", end="")
            self.out.print(text, markup=False)
        elif kind == "memory" and e["action"] not in ("prefill",):
            reason = escape(str(e.get("reason", "")))
            self.out.print(f"  [magenta]memory[/magenta] {escape(str(e['action']))} {reason}")

    def _decide(self, e: dict) -> None:
        """The turn's decision: what (the calls, or text), who decided, and on what evidence."""
        what = ", ".join(e.get("calls") or []) if e["kind"] == "call" else "text"
        evidence = [e["how"]]
        if e.get("p_call") is not None:
            evidence.append(f"p(call)={e['p_call']:.2f}")
        if e.get("score") is not None:
            evidence.append(f"score={e['score']:+.2f}")
        evidence.append(f"top1={e.get('top1', 0.0):.2f} margin={e.get('margin', 0.0):.2f}")
        shown = f"{len(e.get('candidates') or [])} candidate(s)"
        if e.get("spliced"):
            shown += f", {e['spliced']} block(s) spliced"
        notes = []
        if e.get("repeated"):
            notes.append(f"{e['repeated']} again on no new part of the request")
        if e.get("vetoed"):
            notes.append("vetoed: the model's near-certain no")
        if e.get("rechecked"):
            notes.append(f"rechecked as text ({', '.join(e['rechecked'])})")
        self.out.print(f"[cyan]decide[/cyan] → [bold]{escape(what)}[/bold] [dim]{escape(' '.join(evidence))} · "
                       f"{escape(shown)} · {e.get('decide_ms', 0.0):.0f} ms[/dim]"
                       + (f" [yellow]{escape('; '.join(notes))}[/yellow]" if notes else ""))

    def done(self, result) -> None:
        self._kind = None
        if self.quiet:
            self.out.print()
            return
        self.out.print(f"\n[dim]{len(result.calls)} tool call(s)[/dim]")
