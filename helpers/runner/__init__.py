"""Batch execution of notebooks (papermill), with the section record and the silent-skip guard.

The runner executes notebooks and reads what they record; it imports no lesson code and no grading code
(helpers.grading). Names are
imported on first use, so the per-notebook driver process (helpers.runner.drive) starts without torch.
"""
__all__ = ["run_collection", "run_notebook", "section_problems"]


def __getattr__(name: str):
    if name in __all__:
        from helpers.runner import execute
        return getattr(execute, name)
    raise AttributeError(f"module 'helpers.runner' has no attribute {name!r}")
