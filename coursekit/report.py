"""Every chapter ends with "what the literature reports vs what we measured": a table and a plot.

    literature_table(rows, source="paper")        # rows: (quantity, reported, measured, ...)
    paired_bars(ax, labels, reported, measured)    # the numeric rows side by side
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from IPython.display import Markdown, display

REPORTED_COLOR, MEASURED_COLOR = "#8c8c8c", "#dd8452"


def literature_table(rows: Sequence[Sequence], source: str = "paper") -> None:
    """Display a Markdown table from rows whose first three items are (quantity, reported,
    measured); any further items (numbers for the plot) are ignored."""
    lines = [f"| quantity | {source} | measured here |", "|---|---|---|"]
    lines += [f"| {row[0]} | {row[1]} | {row[2]} |" for row in rows]
    display(Markdown("\n".join(lines)))


def paired_bars(ax, labels: Sequence[str], reported: Sequence[float], measured: Sequence[float],
                source: str = "paper", fmt: str | Callable[[float], str] = "%.2f×") -> None:
    """Reported and measured values side by side on ``ax``, each bar labelled with ``fmt``
    (a %-format or a function of the value)."""
    if not len(labels) == len(reported) == len(measured):
        raise ValueError(f"got {len(labels)} labels, {len(reported)} reported and {len(measured)} measured values")
    pos = np.arange(len(labels))
    for offset, values, name, color in ((-0.2, reported, source, REPORTED_COLOR),
                                        (0.2, measured, "measured here", MEASURED_COLOR)):
        bars = ax.bar(pos + offset, values, width=0.4, label=name, color=color)
        if callable(fmt):
            ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=8)
        else:
            ax.bar_label(bars, fmt=fmt, fontsize=8)
    ax.set_xticks(pos, labels, fontsize=8)
    ax.legend(frameon=False)
