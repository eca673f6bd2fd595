"""Slider demos in a few lines: sliders in, a matplotlib figure out.

    def draw(ax, batch=32, depth=4):
        ax.bar(...)
    slider_plot(draw, batch=(1, 256, 1), depth=(1, 12, 1))

Each keyword is an ipywidgets abbreviation: (min, max, step) for an int/float slider, a list
for a dropdown. ``draw`` receives a fresh Axes (or a list of them, with ``ncols``) and the
current values. Outside a notebook front end the figure is still drawn once with the
defaults, so notebooks executed in tests exercise the same code.

``lecture_mode()`` (called by the lecture dashboards of ``make demo``) enlarges the type of
every figure drawn afterwards, for a projector.
"""
from __future__ import annotations

import base64
import traceback
from typing import Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.core.pylabtools import print_figure
from IPython.display import display


# Default text sizes for projected figures (matplotlib's defaults are 10 and 12 points).
LECTURE_RC = {"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "xtick.labelsize": 12,
              "ytick.labelsize": 12, "legend.fontsize": 12, "figure.dpi": 110}


def lecture_mode() -> None:
    """Larger default type and sharper figures, and no progress bars, for dashboards shown on a
    projector.

    ``TQDM_DISABLE`` reaches only the plain progress bars: the notebook ones (``tqdm.auto`` in a
    kernel) set ``disable`` themselves, so they are turned off here."""
    plt.rcParams.update(LECTURE_RC)
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


def slider_plot(draw: Callable, ncols: int = 1, figsize=(7, 3.5), defaults: dict | None = None,
                **controls):
    """Show sliders for ``controls`` and redraw ``draw(ax, **values)`` on every change.

    Returns nothing: it is the last line of a demo cell, and a returned widget would be shown
    a second time as the cell's value.

    The figure is rendered here and handed to the output widget as a finished image, not captured
    with ``with output:``. A captured display makes nbclient (which runs the lecture dashboards
    and executed notebooks) write each output back to the kernel on the shell channel while it
    waits for the cell's reply there; a reply that lands during such a write can be missed, and
    the dashboard then waits for it forever.
    """
    defaults = defaults or {}
    values, inputs = {}, {}
    for name, spec in controls.items():
        value = defaults.get(name, _default(spec))
        if isinstance(spec, tuple):
            cls = widgets.FloatSlider if any(isinstance(v, float) for v in spec) else widgets.IntSlider
            lo, hi = spec[0], spec[1]
            step = spec[2] if len(spec) > 2 else 1
            inputs[name] = cls(value=value, min=lo, max=hi, step=step, description=name,
                               continuous_update=False)
        elif isinstance(spec, list):
            inputs[name] = widgets.Dropdown(options=spec, value=value, description=name)
        else:
            values[name] = spec  # a constant passed through to draw
    out = widgets.Output()

    def render() -> dict:
        fig, axes = plt.subplots(1, ncols, figsize=figsize, squeeze=False)
        try:
            draw(axes[0, 0] if ncols == 1 else list(axes[0]),
                 **values, **{name: w.value for name, w in inputs.items()})
            fig.tight_layout()
            png = print_figure(fig, "png")
        finally:
            plt.close(fig)  # else the notebook's inline backend shows it a second time
        return {"output_type": "display_data", "metadata": {},
                "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": repr(fig)}}

    def redraw(_change=None) -> None:
        try:
            out.outputs = (render(),)
        except Exception as e:  # noqa: BLE001 - a control's callback shows the error where the plot was
            out.outputs = ({"output_type": "error", "ename": type(e).__name__, "evalue": str(e),
                            "traceback": traceback.format_exception(e)},)

    out.outputs = (render(),)  # the first figure: an error here fails the cell
    for w in inputs.values():
        w.observe(redraw, names="value")
    controls_box = widgets.HBox(list(inputs.values()), layout=widgets.Layout(flex_flow="row wrap"))
    display(widgets.VBox([controls_box, out]))
