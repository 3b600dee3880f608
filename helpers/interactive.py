"""Interactive controls that never block a headless run.

    interact(show_code, which=widgets.Dropdown(options=names))

In JupyterLab this is ipywidgets.interact. In headless batch runs (LABS_HEADLESS=1, which the batch
runner, the test suite and `notebooks fix` set), executing a cell that builds widgets can leave the
notebook client waiting forever on a kernel that is already idle (jupyter/nbclient#312,
nteract/papermill#723; seen here on the interact cells). There the function is called once with each
control's current value instead, and the output says so.
"""
from __future__ import annotations

import os
from typing import Callable

HEADLESS_ENV = "LABS_HEADLESS"


def headless() -> bool:
    return os.environ.get(HEADLESS_ENV) == "1"


def _current_value(name: str, control):
    if hasattr(control, "value"):          # a widget
        return control.value
    if isinstance(control, (list, tuple)) and control and not all(isinstance(c, (int, float)) for c in control):
        first = control[0]                  # ipywidgets' option-list shorthand: the first option
        return first[1] if isinstance(first, tuple) else first
    if isinstance(control, (bool, str, int, float)):
        return control
    raise TypeError(f"control {name!r}: pass a widget, a list of options or a fixed value, not {control!r}")


def interact(fn: Callable, *, manual: bool = False, **controls):
    """ipywidgets.interact (or interact_manual with manual=True) in a live kernel; in a headless run,
    one call of fn with the controls' current values (none with manual=True: nothing was clicked)."""
    if not headless():
        import ipywidgets
        return (ipywidgets.interact_manual if manual else ipywidgets.interact)(fn, **controls)
    values = {name: _current_value(name, c) for name, c in controls.items()}
    if manual:
        print(f"(headless run: the controls and their Run button appear in JupyterLab; "
              f"{fn.__name__} is not called here)")
        return None
    print(f"(headless run: the controls appear in JupyterLab; showing {fn.__name__} at its initial values)")
    return fn(**values)
