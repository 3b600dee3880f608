"""Grading lab submissions. Data flows one way:

    specs (cases, references, forbidden calls) -> judge (one case's verdict) and checks (how an exercise is
    called and recorded; the notebook's check) -> sandbox (the student's process) and isolation (the
    operating system's walls around it) -> grade (a class, its limits and its budget) -> report (scores.csv,
    feedback).

The batch runner (helpers.runner) never imports this package.
"""
