"""One plot style for every demo figure, in a notebook and on a projector.

A figure is drawn at the size it is shown: its width in inches times :data:`DPI` (96, a CSS
pixel per 1/96 inch) is its width on the page, so a point of type is a point on the screen.
It is rendered at twice that pixel density (sharp on high-density screens and when a
projector scales it) and handed over with its display size. Fonts come from here only: demo
cells never pass ``fontsize``; :func:`lecture_mode` (``make demo``) makes the figures as wide
as the lecture page and the type large enough for the back row.

:func:`check_figure` lists what makes a figure illegible: text smaller than the style's
smallest size, a numeric axis without a label, text outside the figure, a label taller or wider
than its axes, a legend over the data's markers or over other text. ``slider_plot`` runs it on every demo figure
when ``COURSE_CHECK_FIGURES=1``, and in fast mode on the draw functions a notebook defines, so
the test suite's runs of every chapter check every demo figure at its default values.
"""
from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np


DPI = 96  # CSS pixels per inch: a figure's inches × DPI = its size on the page


@dataclass(frozen=True)
class Look:
    width: float  # inches; × DPI = the figure's width on the page in CSS pixels
    font: float   # points: axis labels and titles; ticks, legends and annotations are SMALLER × this
    max_height: float  # inches: taller figures are scaled down to fit a screen


# JupyterLab's output area is ~900 CSS px wide; the lecture page (grader/demo_template) ~1440 px.
NOTEBOOK = Look(width=9.4, font=11, max_height=6.0)
LECTURE = Look(width=14.8, font=19, max_height=8.0)
SMALLER = 0.85  # ticks, legends, bar labels: one step below the labels, never below this fraction

_lecture = False


def lecture() -> bool:
    """Whether :func:`lecture_mode` switched the projector look on."""
    return _lecture


def look(lecture_look: bool | None = None) -> Look:
    """The look in use (or the one asked for)."""
    return LECTURE if (_lecture if lecture_look is None else lecture_look) else NOTEBOOK


def rc(lecture_look: bool | None = None) -> dict:
    """The rcParams of the course's style (the notebook look, or the lecture look)."""
    lk = look(lecture_look)
    big = lk is LECTURE
    small = round(lk.font * SMALLER, 1)
    return {"font.size": small, "axes.titlesize": lk.font, "axes.labelsize": lk.font,
            "xtick.labelsize": small, "ytick.labelsize": small, "legend.fontsize": small,
            "legend.title_fontsize": small, "figure.titlesize": lk.font,
            "figure.dpi": DPI, "savefig.dpi": 2 * DPI, "figure.constrained_layout.use": True,
            "legend.frameon": False, "axes.spines.top": False, "axes.spines.right": False,
            "lines.markersize": 8 if big else 6, "lines.linewidth": 2.2 if big else 1.5}


def use(lecture_look: bool | None = None) -> None:
    """Apply the style to every figure drawn afterwards (plain matplotlib cells included)."""
    plt.rcParams.update(rc(lecture_look))


def set_lecture(on: bool = True) -> None:
    """Switch the projector look on (``lecture_mode`` calls this) and apply it."""
    global _lecture
    _lecture = bool(on)
    use()


def display_size(figsize, lecture_look: bool | None = None) -> tuple[float, float]:
    """The size a figure is drawn at: as wide as the page, with ``figsize``'s aspect ratio
    (``figsize`` is the shape a demo asks for, (width, height) in any unit)."""
    w, h = figsize
    if w <= 0 or h <= 0:
        raise ValueError(f"figsize must be two positive numbers, got {figsize!r}")
    lk = look(lecture_look)
    height = lk.width * h / w
    if height > lk.max_height:  # a tall figure (one square panel): narrower rather than off-screen
        return lk.max_height * w / h, lk.max_height
    return lk.width, height


def render_png(fig) -> tuple[bytes, dict]:
    """PNG bytes at twice the display pixel density and the metadata that shows it at display size."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=2 * DPI, facecolor="white")
    png = buf.getvalue()
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk: the pixels matplotlib wrote
    return png, {"width": width // 2, "height": height // 2}


def checking(draw) -> bool:
    """Whether slider_plot checks the figures of ``draw``: COURSE_CHECK_FIGURES=1 or 0 decides;
    unset, fast mode (the test suite's notebook runs) checks every named draw function a notebook
    defines (``def draw(ax, ...)`` in a demo cell), not a one-line lambda."""
    value = os.environ.get("COURSE_CHECK_FIGURES", "")
    if value:
        return value not in ("0", "false", "False")
    from coursekit.config import FAST
    return FAST and getattr(draw, "__module__", None) == "__main__" and getattr(draw, "__name__", "") != "<lambda>"


# --- checks -----------------------------------------------------------------------------------

def _texts(fig):
    """(what, Text) for every visible piece of text in the figure."""
    for ax in fig.axes:
        for name, t in (("title", ax.title), ("left title", ax._left_title), ("right title", ax._right_title),
                        ("x label", ax.xaxis.label), ("y label", ax.yaxis.label)):
            yield name, t, ax
        for axis, lim, i in ((ax.xaxis, ax.get_xlim(), 0), (ax.yaxis, ax.get_ylim(), 1)):
            if not ax.axison:  # ax.axis("off"): no ticks are drawn
                break
            lo, hi = sorted(lim)
            for t in axis.get_ticklabels():  # only the ticks drawn: those inside the view limits
                if lo - 1e-9 * abs(hi - lo) <= t.get_position()[i] <= hi + 1e-9 * abs(hi - lo):
                    yield "tick label", t, ax
        for t in ax.texts:
            yield "text", t, ax
        legend = ax.get_legend()
        if legend is not None:
            for t in legend.get_texts():
                yield "legend", t, ax
    for t in fig.texts:
        yield "figure text", t, None


def _numeric_ticks(axis) -> bool:
    """Whether an axis shows numbers (a quantity needing a label), not category names."""
    labels = [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    if not labels:
        return False
    digits = sum(any(ch.isdigit() for ch in s) and not any(ch.isalpha() for ch in s.replace("e", ""))
                 for s in labels)
    return digits * 2 > len(labels)


def check_figure(fig, where: str = "figure", lecture_look: bool | None = None) -> list[str]:
    """What makes ``fig`` hard to read, one message per problem (empty when legible). The figure
    must have been drawn (``fig.canvas.draw()``) at its final size."""
    problems = []
    renderer = fig.canvas.get_renderer()
    fig_box = fig.bbox
    smallest = look(lecture_look).font * SMALLER - 0.05
    tol = 2.0  # pixels
    seen, small = set(), {}
    for what, t, ax in _texts(fig):
        if not t.get_visible() or not t.get_text().strip() or id(t) in seen:
            continue
        seen.add(id(t))
        label = f"{where}: {what} {t.get_text()[:40]!r}"
        if t.get_fontsize() < smallest:
            small.setdefault((what, t.get_fontsize()), []).append(t.get_text())
        box = t.get_window_extent(renderer)
        if (box.x0 < fig_box.x0 - tol or box.x1 > fig_box.x1 + tol or box.y0 < fig_box.y0 - tol
                or box.y1 > fig_box.y1 + tol):
            problems.append(f"{label} runs outside the figure")
        if what == "y label" and ax is not None and box.height > ax.get_window_extent(renderer).height * 1.02:
            problems.append(f"{label} is taller than its plot: shorten it")
        if what == "title" and ax is not None and box.width > fig_box.width * 1.0 + tol:
            problems.append(f"{label} is wider than the figure: shorten it")
    for (what, size), texts in small.items():
        problems.append(f"{where}: {len(texts)} {what}(s) ({', '.join(repr(x[:30]) for x in texts[:3])}"
                        f"{', ...' if len(texts) > 3 else ''}) at {size:g} pt, below the style's "
                        f"{smallest:.1f} pt: a hard-coded fontsize?")
    for i, ax in enumerate(fig.axes):
        if not ax.axison:
            continue
        ticks = [t for what, t, a in _texts(fig) if a is ax and what == "tick label" and t.get_visible()
                 and t.get_text().strip()]
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ticks]
        for j, (text, box) in enumerate(boxes):
            clash = next((other for other, b in boxes[j + 1:] if box.overlaps(b)), None)
            if clash is not None:
                problems.append(f"{where}: axes {i}'s tick labels {text!r} and {clash!r} overlap")
                break
        for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if axis.get_visible() and _numeric_ticks(axis) and not axis.label.get_text().strip():
                problems.append(f"{where}: axes {i} has numbers on its {name} axis but no {name} label "
                                "(say what and in which unit)")
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            lbox = legend.get_window_extent(renderer)
            own = {id(t) for t in legend.get_texts()}
            for what, t, _ in _texts(fig):
                if (id(t) not in own and t.get_visible() and t.get_text().strip()
                        and lbox.overlaps(t.get_window_extent(renderer))):
                    problems.append(f"{where}: axes {i}'s legend lies over the {what} {t.get_text()[:30]!r}")
                    break
            for line in ax.get_lines():
                if line.get_marker() in (None, "", "None", " ") or not line.get_visible():
                    continue
                xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
                inside = (xy[:, 0] > lbox.x0) & (xy[:, 0] < lbox.x1) & (xy[:, 1] > lbox.y0) & (xy[:, 1] < lbox.y1)
                if inside.any():
                    problems.append(f"{where}: axes {i}'s legend covers {int(inside.sum())} marker(s) of "
                                    f"{line.get_label()!r}: move it (loc=...) or make room")
                    break
    return problems
