"""What happened in a lesson, for whoever listens: the lowest modules report, without knowing who keeps it.

    subscribe(fn)                          # fn(kind, **fields), called on every event from now on
    emit("check", what="Exercise 1: softmax", passed=True)

Kinds: "section" (`helpers.device.requires`: section, needs, ran, reason), "check" (`helpers.checks`: what,
passed) and "prediction" (`helpers.interactive.reveal`: question, held). The learner's progress log
(helpers.progress) subscribes when `helpers` is imported. It imports nothing of the package, so every module
may emit. A listener must not raise: it runs inside the lesson's own call.
"""
from __future__ import annotations

from typing import Callable

_listeners: list[Callable[..., None]] = []


def subscribe(listener: Callable[..., None]) -> None:
    """Call `listener(kind, **fields)` on every event from now on (once, however often it subscribes)."""
    if listener not in _listeners:
        _listeners.append(listener)


def emit(kind: str, **fields) -> None:
    """Tell every listener, in the order they subscribed."""
    for listener in tuple(_listeners):
        listener(kind, **fields)
