"""PyTorch 2.10 Labs: the helpers every lesson and lab imports.

Small modules of plain functions: `device` (the only place that inspects hardware), `bench`
(timing and machine limits), `checks` (lab checks with hints), `manifest`, `notebooks`, `runner`,
and one module per topic. The lowest modules emit what happens in a lesson (`events`); the learner's
progress log (`progress`) listens, from this first import on, so a learner's kernel records it whichever
module a notebook imports first. `progress` imports only the standard library here, and records nothing
outside a Jupyter kernel or in a headless run.
"""
from helpers import progress  # noqa: F401  (subscribes to helpers.events and watches a learner's kernel)

__version__ = "0.1.0"
