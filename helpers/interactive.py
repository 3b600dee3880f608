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

from helpers import events
from helpers.env import HEADLESS_ENV


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


class Prediction:
    """A learner's answer to a prediction prompt, read when the measurement is revealed: in JupyterLab
    from the control shown with the question (so changing it before the reveal counts), in a headless
    run the prompt's example answer."""

    def __init__(self, question: str, options: tuple | None, unit: str, example, control=None):
        self.question, self.options, self.unit, self.example, self.control = question, options, unit, example, control

    def answer(self):
        """The chosen option or number; None when a live learner has not answered yet."""
        if self.control is None:
            return self.example
        if self.options is not None:
            return self.control.value
        try:
            return float(self.control.value)
        except ValueError:                  # empty or not a number
            return None


def predict(question: str, *, options: list | tuple | None = None, unit: str = "", example) -> Prediction:
    """A prediction prompt, before the cells that measure its answer: a choice among `options`, or a
    number (in `unit`) without them. `example` is the answer a headless run records and goes on with.
    Reveal the outcome after the measurement with `reveal(prediction, measured, why=...)`."""
    options = tuple(options) if options is not None else None
    if options is not None and example not in options:
        raise ValueError(f"example answer {example!r} is not one of the options {options}")
    if options is None and not isinstance(example, (int, float)):
        raise TypeError(f"a numeric prediction needs a number as its example answer, not {example!r}")
    print(f"🔮 Predict: {question}")
    if headless():
        print(f"(headless run: answered {example!r}{' ' + unit if unit and options is None else ''}, "
              f"the prompt's example answer)")
        return Prediction(question, options, unit, example)
    import ipywidgets
    from IPython.display import display
    if options is not None:
        control = ipywidgets.RadioButtons(options=list(options), value=None, layout={"width": "max-content"})
    else:
        control = ipywidgets.Text(placeholder=f"a number{' in ' + unit if unit else ''}",
                                  description="Your answer:", style={"description_width": "initial"})
    display(control)
    print("Choose before you run the next cells; your answer is read when the result is revealed.")
    return Prediction(question, options, unit, example, control)


def prediction_held(answer, measured, tolerance: float) -> bool:
    """An option holds when it equals the measured one; a number when it is within a factor
    `tolerance` of the measured value (1 means exactly), same sign."""
    if isinstance(answer, str) or isinstance(measured, str):
        return answer == measured
    if tolerance == 1 or answer == 0 or measured == 0:
        return answer == measured
    if (answer > 0) != (measured > 0):
        return False
    ratio = answer / measured
    return 1 / tolerance <= ratio <= tolerance


def reveal(prediction: Prediction, measured, *, why: str, tolerance: float = 2.0, where: str = "here") -> bool | None:
    """After the measurement: the answer against what was measured on this machine (or, where this machine
    cannot measure it, on the one `where` names), and why it came out so (`why` is written from the measured
    values). Returns whether the prediction held (None: no answer),
    which is emitted as a "prediction" event (helpers.events) for the learner's progress (helpers.progress)."""
    answer = prediction.answer()
    # bool(): numpy scalars compare to a numpy.bool_, which the progress file cannot hold
    held = None if answer is None else bool(prediction_held(answer, measured, tolerance))
    events.emit("prediction", question=prediction.question, held=held)
    shown = f"{measured:.3g}" if isinstance(measured, float) else str(measured)
    unit = f" {prediction.unit}" if prediction.unit and prediction.options is None else ""
    print(f"Question: {prediction.question}")
    if answer is None:
        print(f"You did not answer. Measured {where}: {shown}{unit}.")
        print(f"Why: {why}")
        return None
    within = "" if prediction.options is not None or tolerance == 1 else f" (within a factor {tolerance:g})"
    print(f"Your answer: {answer}{unit}. Measured {where}: {shown}{unit}. "
          + ("✅ Your prediction held" if held else "❌ Your prediction did not hold") + within + ".")
    print(f"Why: {why}")
    return held
