"""PyTorch 2.10 Labs: the helpers every lesson and lab imports.

Small modules of plain functions: `device` (the only place that inspects hardware), `bench`
(timing and machine limits), `checks` (lab checks with hints), `manifest`, `notebooks`, `runner`,
and one module per topic.
"""
__version__ = "0.1.0"
