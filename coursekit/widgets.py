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

from typing import Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display


# Default text sizes for projected figures (matplotlib's defaults are 10 and 12 points).
LECTURE_RC = {"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "xtick.labelsize": 12,
              "ytick.labelsize": 12, "legend.fontsize": 12, "figure.dpi": 110}


def lecture_mode() -> None:
    """Larger default type and sharper figures, for dashboards shown on a projector."""
    plt.rcParams.update(LECTURE_RC)


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
    """
    defaults = defaults or {}
    kwargs = {}
    for name, spec in controls.items():
        value = defaults.get(name, _default(spec))
        if isinstance(spec, tuple):
            cls = widgets.FloatSlider if any(isinstance(v, float) for v in spec) else widgets.IntSlider
            lo, hi = spec[0], spec[1]
            step = spec[2] if len(spec) > 2 else 1
            kwargs[name] = cls(value=value, min=lo, max=hi, step=step, description=name,
                               continuous_update=False)
        elif isinstance(spec, list):
            kwargs[name] = widgets.Dropdown(options=spec, value=value, description=name)
        else:
            kwargs[name] = widgets.fixed(spec)
    out = widgets.Output()

    def redraw(**values):
        with out:
            out.clear_output(wait=True)
            fig, axes = plt.subplots(1, ncols, figsize=figsize, squeeze=False)
            draw(axes[0, 0] if ncols == 1 else list(axes[0]), **values)
            fig.tight_layout()
            plt.show()

    ui = widgets.interactive(redraw, **kwargs)
    controls_box = widgets.HBox(ui.children[:-1], layout=widgets.Layout(flex_flow="row wrap"))
    display(widgets.VBox([controls_box, out]))
    ui.update()
