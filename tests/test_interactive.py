"""helpers.interactive: real widgets in a live kernel, one plain call in headless runs."""
import ipywidgets as widgets
import pytest

from helpers import interactive


def record(calls):
    def show(size=1, name="a"):
        calls.append((size, name))
    return show


def test_headless_calls_once_with_the_controls_current_values(monkeypatch, capsys):
    monkeypatch.setenv(interactive.HEADLESS_ENV, "1")
    calls = []
    interactive.interact(record(calls), size=widgets.IntSlider(value=8, min=4, max=18), name=["x", "y"])
    assert calls == [(8, "x")]
    assert "headless run" in capsys.readouterr().out
    interactive.interact(record(calls), manual=True, size=widgets.IntSlider(value=3))
    assert calls == [(8, "x")], "manual controls run nothing until clicked"
    interactive.interact(record(calls), name=[("first label", "v1"), ("second", "v2")])
    assert calls[-1] == (1, "v1")


def test_live_kernel_gets_real_widgets(monkeypatch):
    monkeypatch.delenv(interactive.HEADLESS_ENV, raising=False)
    calls = []
    w = interactive.interact(record(calls), size=widgets.IntSlider(value=5))
    assert calls == [(5, "a")] and hasattr(w, "widget")


def test_unusable_control_is_rejected(monkeypatch):
    monkeypatch.setenv(interactive.HEADLESS_ENV, "1")
    with pytest.raises(TypeError, match="control 'size'"):
        interactive.interact(record([]), size=object())


def test_headless_prediction_records_the_example_and_reveal_judges_it(monkeypatch, capsys):
    monkeypatch.setenv(interactive.HEADLESS_ENV, "1")
    choice = interactive.predict("Which?", options=["threads", "processes"], example="threads")
    number = interactive.predict("Speed-up?", unit="x", example=2.0)
    assert "answered 'threads'" in capsys.readouterr().out
    assert interactive.reveal(choice, "threads", why="it releases the GIL") is True
    assert interactive.reveal(choice, "processes", why="the GIL") is False
    assert interactive.reveal(number, 3.9, why="w", tolerance=2) is True
    assert interactive.reveal(number, 4.1, why="w", tolerance=2) is False
    out = capsys.readouterr().out
    assert "✅ Your prediction held" in out and "❌ Your prediction did not hold" in out and "Why: the GIL" in out
    interactive.reveal(choice, "threads", why="w", where="on the recorded NVIDIA H200")
    assert "Measured on the recorded NVIDIA H200: threads." in capsys.readouterr().out


def test_prediction_rules():
    assert interactive.prediction_held(3, 3, tolerance=1) and not interactive.prediction_held(3, 4, tolerance=1)
    assert not interactive.prediction_held(-2.0, 2.0, tolerance=10), "a sign is never within a factor"
    assert interactive.prediction_held(0.5, 1.0, tolerance=2) and not interactive.prediction_held(0.4, 1.0, tolerance=2)
    with pytest.raises(ValueError, match="not one of the options"):
        interactive.predict("?", options=["a"], example="b")
    with pytest.raises(TypeError, match="needs a number"):
        interactive.predict("?", example="two")


def test_live_prediction_reads_the_control_when_revealed(monkeypatch, capsys):
    monkeypatch.delenv(interactive.HEADLESS_ENV, raising=False)
    choice = interactive.predict("Which?", options=["a", "b"], example="a")
    assert choice.answer() is None, "nothing is chosen until the learner chooses"
    assert interactive.reveal(choice, "b", why="w") is None and "You did not answer" in capsys.readouterr().out
    choice.control.value = "b"
    assert interactive.reveal(choice, "b", why="w") is True
    number = interactive.predict("How many?", example=3)
    number.control.value = "not a number"
    assert number.answer() is None
    number.control.value = "4"
    assert number.answer() == 4.0
