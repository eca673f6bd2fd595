"""Slider demos in a few lines: sliders in, a matplotlib figure out.

    def draw(ax, batch=32, depth=4):
        ax.bar(...)
    slider_plot(draw, batch=(1, 256, 1), depth=(1, 12, 1))

Each keyword is an ipywidgets abbreviation: (min, max, step) for an int/float slider, a list
for a dropdown. ``draw`` receives a fresh Axes (or a list of them, with ``ncols``) and the
current values. Outside a notebook front end the figure is still drawn once with the
defaults, so notebooks executed in tests exercise the same code.

A control is labelled in words, with its unit and the value it stands for:
``labels={"log2_micro": lambda v: f"micro-batch size: {2 ** v}"}`` (a callable of the value) or
``labels={"rank": "LoRA rank r"}`` (a plain name: the slider shows the value beside it).

Figures follow ``coursekit.style``: drawn at the size they are shown, rendered at twice the
pixel density, fonts from the style only. ``lecture_mode()`` (called by the lecture dashboards
of ``make demo``) switches to the projector look: page-wide figures, large type.
"""
from __future__ import annotations

import base64
import html
import traceback
from typing import Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from coursekit import style


def lecture_mode() -> None:
    """The projector look (page-wide figures, large type: ``coursekit.style.LECTURE``) and no
    progress bars, for dashboards shown on a projector.

    ``TQDM_DISABLE`` reaches only the plain progress bars: the notebook ones (``tqdm.auto`` in a
    kernel) set ``disable`` themselves, so they are turned off here."""
    style.set_lecture(True)
    try:
        from tqdm import notebook
    except ImportError:  # no ipywidgets: tqdm.auto gives plain bars, which TQDM_DISABLE turns off
        return
    init = notebook.tqdm_notebook.__init__
    if getattr(init, "_lecture_mode", False):
        return

    def quiet(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    quiet._lecture_mode = True
    notebook.tqdm_notebook.__init__ = quiet


def _default(spec):
    if isinstance(spec, tuple):
        return spec[0]
    if isinstance(spec, list):
        return spec[0]
    return spec


def _describe(name: str, label, value) -> tuple[str, bool]:
    """A control's text and whether it already shows the value (then the slider's readout is hidden)."""
    if label is None:
        return name, False
    if callable(label):
        return str(label(value)), True
    return str(label), False


def render_figure(draw: Callable, ncols: int, figsize, values: dict, check: bool = False,
                  lecture_look: bool | None = None) -> tuple[bytes, dict]:
    """``draw`` on a fresh figure in the course's style (the look in use, or the one asked for):
    PNG bytes at twice the display density and the metadata that shows them at display size.
    With ``check``, an illegible figure raises ``ValueError`` naming what to fix
    (``coursekit.style.check_figure``)."""
    with plt.rc_context(style.rc(lecture_look)):
        fig, axes = plt.subplots(1, ncols, figsize=style.display_size(figsize, lecture_look), squeeze=False)
        try:
            draw(axes[0, 0] if ncols == 1 else list(axes[0]), **values)
            if check:
                fig.canvas.draw()
                look = "lecture" if style.look(lecture_look) is style.LECTURE else "notebook"
                problems = style.check_figure(fig, f"{getattr(draw, '__name__', 'figure')} ({look} look)",
                                              lecture_look)
                if problems:
                    raise ValueError("illegible figure:\n  " + "\n  ".join(problems))
            return style.render_png(fig)
        finally:
            plt.close(fig)  # else the notebook's inline backend shows it a second time


def _notice_text(fn: Callable, current: dict) -> str:
    try:
        return str(fn(**current))
    except Exception as e:  # noqa: BLE001 - a broken notice line must not cost the plot
        return f"(notice failed: {type(e).__name__}: {e})"


def slider_plot(draw: Callable, ncols: int = 1, figsize=(7, 3.5), defaults: dict | None = None,
                labels: dict | None = None, explain: dict | None = None, notice: dict | None = None,
                **controls):
    """Show sliders for ``controls`` and redraw ``draw(ax, **values)`` on every change.

    ``figsize`` gives the figure's shape (its aspect ratio): it is drawn as wide as the page
    (``coursekit.style``). Per control, all optional:

    - ``labels``: its words and unit, a string or a callable of the value giving the whole text
      ("micro-batch size: 256");
    - ``explain``: one static line shown beside it, what the control changes;
    - ``notice``: what to notice, a callable of all current values (as keywords, like ``draw``
      without ``ax``) returning one short line, updated on every change; it must read
      precomputed numbers only.

    A "reset to defaults" button puts every control back and redraws once. The lecture page
    finds the parts by their classes: ``course-demo`` (the whole), ``course-control`` (a control
    and its lines), ``course-explain``, ``course-notice``, ``course-reset``.

    Returns nothing: it is the last line of a demo cell, and a returned widget would be shown
    a second time as the cell's value.

    The figure is rendered here and handed to the output widget as a finished image, not captured
    with ``with output:``. A captured display makes nbclient (which runs the lecture dashboards
    and executed notebooks) write each output back to the kernel on the shell channel while it
    waits for the cell's reply there; a reply that lands during such a write can be missed, and
    the dashboard then waits for it forever.
    """
    defaults, labels, explain, notice = defaults or {}, labels or {}, explain or {}, notice or {}
    for what, given in (("defaults", defaults), ("labels", labels), ("explain", explain), ("notice", notice)):
        unknown = sorted(set(given) - set(controls))
        if unknown:
            raise ValueError(f"{what} names {', '.join(unknown)}, which are not controls of this slider_plot "
                             f"(controls: {', '.join(controls)})")
    bad = [name for name, fn in notice.items() if not callable(fn)]
    if bad:
        raise ValueError(f"notice must map each control to a callable of the current values; "
                         f"{', '.join(bad)} is not callable")
    values, inputs = {}, {}
    wide = {"description_width": "initial"}
    for name, spec in controls.items():
        value = defaults.get(name, _default(spec))
        text, shows_value = _describe(name, labels.get(name), value)
        if isinstance(spec, tuple):
            cls = widgets.FloatSlider if any(isinstance(v, float) for v in spec) else widgets.IntSlider
            lo, hi = spec[0], spec[1]
            step = spec[2] if len(spec) > 2 else 1
            inputs[name] = cls(value=value, min=lo, max=hi, step=step, description=text,
                               continuous_update=False, readout=not shows_value, style=wide)
        elif isinstance(spec, list):
            inputs[name] = widgets.Dropdown(options=spec, value=value, description=text, style=wide)
        else:
            values[name] = spec  # a constant passed through to draw
            continue
        inputs[name]._course_name, inputs[name]._course_default = name, value
    out = widgets.Output()
    check = style.checking(draw)
    notices = {name: widgets.HTML().add_class("course-notice") for name in notice if name in inputs}
    resetting = []  # non-empty while the reset button sets the controls: one redraw at the end

    def current() -> dict:
        return {**values, **{n: w.value for n, w in inputs.items()}}

    def render(check: bool = False) -> dict:
        now = current()
        if check:  # a figure is shown in both looks: the one not in use is checked too
            render_figure(draw, ncols, figsize, now, check=True, lecture_look=not style.lecture())
        png, size = render_figure(draw, ncols, figsize, now, check=check)
        return {"output_type": "display_data", "metadata": {"image/png": size},
                "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": "<Figure>"}}

    def relabel() -> None:
        now = current()
        for name, w in inputs.items():
            if callable(labels.get(name)):
                w.description = _describe(name, labels[name], w.value)[0]
        for name, box in notices.items():
            box.value = html.escape(_notice_text(notice[name], now))

    def redraw(change=None) -> None:
        if resetting:
            return
        relabel()
        try:
            out.outputs = (render(),)
        except Exception as e:  # noqa: BLE001 - a control's callback shows the error where the plot was
            out.outputs = ({"output_type": "error", "ename": type(e).__name__, "evalue": str(e),
                            "traceback": traceback.format_exception(e)},)

    def reset(_button=None) -> None:
        resetting.append(True)
        try:
            for w in inputs.values():
                w.value = w._course_default
        finally:
            resetting.clear()
        redraw()

    relabel()
    # The first figure, at the defaults, is the one checked: an error here fails the cell. Redraws
    # are not checked, so that a lecture never shows an error where a plot was.
    out.outputs = (render(check),)
    for w in inputs.values():
        w.observe(redraw, names="value")
    rows = []
    for name, w in inputs.items():
        lines = [widgets.HTML(html.escape(str(explain[name]))).add_class("course-explain")] if name in explain else []
        if name in notices:
            lines.append(notices[name])
        rows.append(widgets.HBox([w, widgets.VBox(lines)]).add_class("course-control"))
    button = widgets.Button(description="reset to defaults", layout=widgets.Layout(width="auto")).add_class("course-reset")
    button.on_click(reset)
    display(widgets.VBox([widgets.VBox(rows), button, out]).add_class("course-demo"))
