"""Lab 10 (the capstone): what the grader's notebook for a project folder imports. The grader turns a
submitted project into a notebook of one cell (helpers.grading.specs.lab10.project_notebook) that writes the
project's files and the starting code's into folders here, imports both, and defines one function per goal:
that goal's measure (helpers.capstone.GOALS) on the project. The judges, and the reference, stay in the
grader."""
from __future__ import annotations

import tempfile
import types
from pathlib import Path

from helpers import capstone

# taken before any project code runs: a project that rebinds capstone.GOALS' entries changes nothing here
MEASURES = types.MappingProxyType({goal: measure for goal, (measure, _) in capstone.GOALS.items()})


def install(files: dict[str, str], start_files: dict[str, str]) -> tuple:
    """The project and the starting code written to folders of their own and imported: (project, start)."""
    projects = []
    for name, sources in (("project", files), ("start", start_files)):
        folder = Path(tempfile.mkdtemp(prefix=f"capstone-{name}-"))
        for file, text in sources.items():
            (folder / Path(file).name).write_text(text)
        projects.append(capstone.load_project(folder))
    return tuple(projects)


def measures(project, start) -> dict:
    """goal -> its measure on the project, called as measure(w, given, **options). Goals that share a measure
    (training feeds three) share its result per workload."""
    done: dict = {}

    def measure_of(goal: str):
        def measure(w: dict, given: dict, **options):
            key = (MEASURES[goal].__name__, repr(sorted(w.items())), repr(sorted(options.items())))
            if key not in done:
                done[key] = MEASURES[goal](project, start, w, given, **options)
            return done[key]
        measure.__name__ = goal
        return measure
    return {goal: measure_of(goal) for goal in MEASURES}
