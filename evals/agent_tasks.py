"""The agent task suite: requests over the bundled servers' tools, each with a gold tool and gold arguments.

`make_tasks(n, seed)` draws n tasks from per-tool templates with seeded values; the same (n, seed) always
gives the same suite. Values are chosen so the gold arguments are unambiguous from the request text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

UNITS = [("km", "mi"), ("kg", "lb"), ("m", "ft"), ("l", "gal"), ("h", "min"), ("C", "F"), ("cm", "in"), ("g", "oz")]
WORDS = ["apples", "budget", "meeting", "garden", "report", "travel", "invoice", "recipe", "python", "music"]
NAMES = ["todo.txt", "notes/plan.md", "data.csv", "draft.txt", "logs/today.log"]
DATES = ["2024-01-15", "2023-07-04", "2025-03-01", "2024-12-25", "2022-02-28", "2026-11-29"]
CATEGORIES = ["length", "mass", "volume", "time", "speed", "temperature"]


@dataclass(frozen=True)
class Task:
    """One request: the text, the tool that should serve it and the exact arguments it should get."""

    request: str
    tool: str
    arguments: dict

    def as_dict(self) -> dict:
        return {"request": self.request, "tool": self.tool, "arguments": self.arguments}


def _templates(r: random.Random):
    a, b = r.randint(2, 999), r.randint(2, 999)
    d1, d2 = r.sample(DATES, 2)
    w = r.choice(WORDS)
    f = r.choice(NAMES)
    u1, u2 = r.choice(UNITS)
    v = r.randint(2, 500)
    n = r.randint(1, 60)
    return [
        (f"Add {a} and {b}", "add", {"a": a, "b": b}),
        (f"Multiply {a} by {b}", "multiply", {"a": a, "b": b}),
        (f"Divide {a} by {b}", "divide", {"numerator": a, "denominator": b}),
        (f"Evaluate the arithmetic expression {a} * ({b} + {n})", "evaluate", {"expression": f"{a} * ({b} + {n})"}),
        (f"What date is {n} days after {d1}?", "add_days", {"date": d1, "days": n}),
        (f"How many days are there between {d1} and {d2}?", "days_between", {"start": d1, "end": d2}),
        (f"What day of the week was {d1}?", "weekday", {"date": d1}),
        (f"Read the file {f}", "read_file", {"path": f}),
        (f"Write the text '{w}' to the file {f}", "write_file", {"path": f, "content": w}),
        (f"Delete the file {f}", "delete_file", {"path": f}),
        (f"Add a note titled {w} with the body 'buy {w}'", "add_note", {"title": w, "body": f"buy {w}"}),
        (f"Show me note number {n}", "get_note", {"note_id": n}),
        (f"Search my notes for {w}", "search_notes", {"query": w}),
        (f"Convert {v} {u1} to {u2}", "convert", {"value": v, "from_unit": u1, "to_unit": u2}),
        (f"List the {r.choice(CATEGORIES)} units", "list_units", None),
    ]


def make_tasks(n: int = 120, seed: int = 0) -> list[Task]:
    """n tasks cycling over the templates (every tool gets its share), values drawn from Random(seed)."""
    r = random.Random(seed)
    out: list[Task] = []
    i = 0
    while len(out) < n:
        text, tool, args = _templates(r)[i % 15]
        if args is None:  # list_units: the category is in the text
            args = {"category": text.split()[2]}
        out.append(Task(text, tool, args))
        i += 1
    return out


@dataclass(frozen=True)
class MultiTask:
    """A request of several steps whose later arguments come from earlier results.

    `steps`: (tool, gold) per step, where gold is a list of acceptable argument dicts, or a function of the
    earlier steps' results (parsed JSON dicts, in order) returning that list.
    """

    request: str
    steps: tuple

    def gold(self, k: int, results: list[dict]) -> list[dict]:
        """Acceptable arguments of step k given the earlier results ([] when those lack what it needs)."""
        tool, g = self.steps[k]
        if not callable(g):
            return g
        try:
            return g(results)
        except (KeyError, IndexError, TypeError):
            return []


def _multi_templates(r: random.Random) -> list[MultiTask]:
    a, b, c = r.randint(2, 99), r.randint(2, 99), r.randint(2, 9)
    d = r.choice(DATES)
    n = r.randint(1, 60)
    w = r.choice(WORDS)
    return [
        MultiTask(f"Add {a} and {b}, then multiply the result by {c}",
                  (("add", [{"a": a, "b": b}, {"a": b, "b": a}]),
                   ("multiply", lambda res, c=c: [{"a": res[0]["result"], "b": c}, {"a": c, "b": res[0]["result"]}]))),
        MultiTask(f"Multiply {a} by {b}, then divide the result by {c}",
                  (("multiply", [{"a": a, "b": b}, {"a": b, "b": a}]),
                   ("divide", lambda res, c=c: [{"numerator": res[0]["result"], "denominator": c}]))),
        MultiTask(f"What date is {n} days after {d}? Then tell me what day of the week that date is",
                  (("add_days", [{"date": d, "days": n}]),
                   ("weekday", lambda res: [{"date": res[0]["date"]}]))),
        MultiTask(f"Add a note titled {w} with the body 'buy {w}', then show me the note with that id",
                  (("add_note", [{"title": w, "body": f"buy {w}"}]),
                   ("get_note", lambda res: [{"note_id": res[0]["id"]}]))),
    ]


def make_multi_tasks(n: int = 20, seed: int = 0) -> list[MultiTask]:
    """n multi-step tasks cycling over the templates, values drawn from Random(seed + 1)."""
    r = random.Random(seed + 1)
    return [_multi_templates(r)[i % 4] for i in range(n)]


def args_equal(got: dict | None, gold: dict, defaults: dict | None = None) -> bool:
    """Exact-argument match: every gold key equal (numbers compared by value, strings exactly); keys the model
    added beyond gold must equal their schema default."""
    if got is None:
        return False
    defaults = defaults or {}
    for k, v in gold.items():
        g = got.get(k, object())
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not isinstance(g, (int, float)) or isinstance(g, bool) or float(g) != float(v):
                return False
        elif g != v:
            return False
    return all(k in gold or (k in defaults and defaults[k] == v) for k, v in got.items())
