"""Markdown tables and PNG figures drawn from an eval's JSON result.

An eval module renders its own section: `table(result) -> str` builds Markdown with `md_table` and `pct`, and each
`Figure` names a PNG file and a function `result -> matplotlib Figure` (None when the result lacks what it needs).
`save_figures` is the one place figures are drawn and written: the report calls it for its folder, an eval's
`--plot PATH` calls `save_plot`. Every axis is labelled with its unit and every line has a legend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def md_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A Markdown table; None cells print as an em dash, floats with 4 significant digits."""

    def cell(v) -> str:
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(v: float | None) -> str | None:
    """A fraction as a percentage with one decimal ("12.5 %"); None stays None."""
    return None if v is None else f"{v * 100:.1f} %"


@dataclass(frozen=True)
class Figure:
    """One PNG of an eval: `file` is its name in the report folder, `draw` builds it from the eval's JSON."""

    file: str
    draw: Callable[[dict], Any]  # result -> matplotlib.figure.Figure, or None when the result lacks the data

    def __post_init__(self) -> None:
        if not self.file.endswith(".png") or "/" in self.file:
            raise ValueError(f"figure file {self.file!r}: a bare PNG file name (NAME.png) is expected")


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (imported on first use: evals load without it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_ticks(ax, xs: list, fmt: str = "{:g}") -> None:
    """Log x axis with ticks at the measured points only (readable labels instead of 2×10¹)."""
    ax.set_xscale("log")
    ax.set_xticks(xs, [fmt.format(x) for x in xs])
    ax.minorticks_off()


def save_figures(figures: Sequence[Figure], result: dict, folder: Path,
                 first_name: str | None = None) -> list[str]:
    """Draw each figure from `result` and write it to folder/<Figure.file> at 120 dpi (the first to
    folder/first_name when given); returns the file names written, without the figures the result lacks data for."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i, figure in enumerate(figures):
        fig = figure.draw(result)
        if fig is None:
            continue
        name = first_name if i == 0 and first_name else figure.file
        if fig.get_layout_engine() is None:  # a figure that set its own layout (room for a legend) keeps it
            fig.tight_layout()
        fig.savefig(folder / name, dpi=120)
        pyplot().close(fig)
        written.append(name)
    return written


def save_plot(figures: Sequence[Figure], result: dict, path: str) -> str | None:
    """An eval's `--plot PATH`: the first figure at PATH, any further one beside it under its own file name.
    Returns PATH, or None when the first figure had nothing to draw."""
    p = Path(path)
    written = save_figures(figures, result, p.parent, p.name)
    return str(p) if p.name in written else None
