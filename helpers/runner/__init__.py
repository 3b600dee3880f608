"""Batch execution of notebooks (papermill), with the section record and the silent-skip guard.

The runner executes notebooks and reads what they record; it imports no lesson code.
"""
from helpers.runner.execute import run_collection, run_notebook, section_problems

__all__ = ["run_collection", "run_notebook", "section_problems"]
