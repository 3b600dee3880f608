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
