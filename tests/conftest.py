"""Markers tied to helpers.device: a test marked requires_cuda (etc.) is skipped with the device
layer's own reason where the machine lacks it, so a skip in the test report says what was missing.
The test suite records no learner progress (LABS_PROGRESS=off, inherited by the kernels it starts)."""
import os

import pytest

from helpers.device import skip_reason
from helpers.progress import PROGRESS_ENV

os.environ[PROGRESS_ENV] = "off"

MARKER_NEEDS = {"requires_cuda": ("cuda",), "requires_rocm": ("rocm",), "requires_xpu": ("xpu",),
                "requires_gpu": ("gpu",)}


def pytest_runtest_setup(item):
    for marker in item.iter_markers():
        if marker.name in MARKER_NEEDS:
            needs = MARKER_NEEDS[marker.name]
        elif marker.name == "requires":
            needs = marker.args
        else:
            continue
        reason = skip_reason(needs)
        if reason:
            pytest.skip(reason)
