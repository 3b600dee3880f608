"""Lab checks: each passes with a clear line, or fails with a hint that says what was wrong.

    check_close(my_output, reference, what="Exercise 1: routed tokens")

A failure raises CheckFailed (an AssertionError) whose message names the exercise, what was wrong
(type, shape, dtype, values, speed) and what to look at. The grader catches CheckFailed per exercise.
Each pass and each CheckFailed is emitted as a "check" event (helpers.events), which the learner's progress
(helpers.progress) keeps in their own kernel.
"""
from __future__ import annotations

from typing import Callable

import torch

from helpers import events

STUB_TEXT = ": your code here"   # the end of what a lab's stub raises (helpers.notebooks writes them): the checks
                                 # and the grader know an untouched stub by it


class CheckFailed(AssertionError):
    """A lab check failed; the message ("❌ what: problem", then the hint) is the hint for the learner. Its
    event is emitted where it is made: the lab checks raise it for every kind of failing case."""

    def __init__(self, message: str):
        super().__init__(message)
        events.emit("check", what=str(message).partition("\n")[0].removeprefix("❌ "), passed=False)


def passed(what: str, detail: str = "") -> None:
    events.emit("check", what=what, passed=True)
    print(f"✅ {what}: passed" + (f" ({detail})" if detail else ""))


def fail(what: str, problem: str, hint: str = "") -> None:
    raise CheckFailed(f"❌ {what}: {problem}" + (f"\n   Hint: {hint}" if hint else ""))


def check_tensor(actual, expected: torch.Tensor, *, what: str, hint: str = "") -> None:
    """Type, shape and dtype of `actual` match `expected`; a failure gives the check's own hint first,
    then the generic one."""
    def with_hint(generic: str) -> str:
        return f"{hint} ({generic})" if hint else generic
    if not isinstance(actual, torch.Tensor):
        fail(what, f"expected a torch.Tensor, got {type(actual).__name__}",
             with_hint("return the tensor itself: did the function return None or a Python list?"))
    if actual.shape != expected.shape:
        fail(what, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}",
             with_hint("check which dimension you reduced, transposed or forgot to reshape"))
    if actual.dtype != expected.dtype:
        fail(what, f"dtype {actual.dtype}, expected {expected.dtype}",
             with_hint("cast explicitly (x.to(dtype)); mixed dtypes are promoted silently in many ops"))


def distinct(got: float, expected: float) -> tuple[str, str]:
    """got and expected with the fewest significant digits, 6 at least, that tell them apart (a float32
    rounding shows as two different numbers, not the same one twice)."""
    for digits in range(6, 18):
        pair = f"{got:.{digits}g}", f"{expected:.{digits}g}"
        if pair[0] != pair[1]:
            break
    return pair


def check_close(actual, expected: torch.Tensor, *, what: str, atol: float = 1e-5, rtol: float = 1e-4,
                hint: str = "") -> None:
    """Shape, dtype and values match within tolerance; on failure, says where and by how much."""
    check_tensor(actual, expected, what=what, hint=hint)
    if actual.device != expected.device:
        actual = actual.to(expected.device)
    a, e = actual.detach().double(), expected.detach().double()
    if torch.isnan(a).any() and not torch.isnan(e).any():
        fail(what, f"{int(torch.isnan(a).sum())} NaN values where the reference has none",
             hint or "look for a division by zero, log of a non-positive value, or uninitialised memory "
                     "(torch.empty)")
    bad = ~torch.isclose(a, e, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        err = (a - e).abs().nan_to_num(posinf=float("inf")).max().item()
        got, want = distinct(a[idx].item(), e[idx].item())
        fail(what, f"{int(bad.sum())} of {a.numel()} values differ (first at index {idx}: got {got}, expected "
                   f"{want} in {expected.dtype}; max abs error {err:.3g}, tolerance atol={atol:g} rtol={rtol:g})",
             hint or "compare your result with the reference on a tiny input, element by element")
    passed(what)


def check_equal(actual, expected, *, what: str, hint: str = "") -> None:
    """Exact equality for tensors (shape, dtype, every value) or plain Python values."""
    if isinstance(expected, torch.Tensor):
        check_tensor(actual, expected, what=what, hint=hint)
        if not torch.equal(actual.cpu(), expected.cpu()):
            diff = (actual.cpu() != expected.cpu()).nonzero()
            idx = tuple(int(i) for i in diff[0])
            fail(what, f"{len(diff)} of {expected.numel()} values differ (first at index {idx}: got "
                       f"{actual.cpu()[idx].item()}, expected {expected.cpu()[idx].item()})", hint)
    elif actual != expected:
        fail(what, f"got {actual!r}, expected {expected!r}", hint)
    passed(what)


def check_raises(fn: Callable[[], object], exception: type[BaseException], *, what: str,
                 match: str | None = None, hint: str = "") -> None:
    """fn() raises `exception` (whose message contains `match`, if given)."""
    try:
        fn()
    except exception as exc:
        if match is not None and match not in str(exc):
            fail(what, f"raised {type(exc).__name__} but its message {str(exc)!r} does not mention {match!r}",
                 hint or "make the error message say what went wrong and how to fix it")
        passed(what)
        return
    except Exception as exc:   # the wrong kind of error is a failure, with the error named
        fail(what, f"raised {type(exc).__name__}: {exc}, expected {exception.__name__}", hint)
    fail(what, f"did not raise {exception.__name__}", hint or "validate the input before using it")


def check_speedup(fast: Callable[[], object], slow: Callable[[], object], *, at_least: float, what: str,
                  device: torch.device | str, hint: str = "", repeats: int = 5, threads: int | None = None,
                  baseline_name: str = "the reference") -> float:
    """`fast` is at least `at_least` times faster than `slow`, measured side by side on `device` (on
    `threads` threads; default: torch's current count); returns the ratio. Labs only: tests never
    assert speed."""
    from helpers.bench import compare
    result = compare({"slow": slow, "fast": fast}, baseline="slow", repeats=repeats, threads=threads,
                     device=device)
    ratio, on = result["results"]["fast"]["ratio_to_baseline"], f"{result['threads']} thread(s)"
    if ratio < at_least:
        fail(what, f"{ratio:.2f}x faster than {baseline_name} ({on}), the target is {at_least:.2f}x",
             hint or "profile it: where does the time go?")
    passed(what, f"{ratio:.2f}x faster than {baseline_name} on {on}, target {at_least:.2f}x")
    return ratio


def your_turn(check: Callable[[], object], *, what: str) -> bool:
    """A lesson's "your turn" cell: run `check` (which calls the check_* functions on the learner's
    change) and say how it went. A lesson goes on either way, so "not yet" prints the hint instead of
    stopping the notebook; returns whether the check passed."""
    try:
        check()
    except CheckFailed as failure:
        print(f"Not yet. {failure}\nChange the value in the cell above and run both cells again.")
        return False
    print(f"🎯 Your turn, {what}: done.")
    return True
