"""The environment variables that say how this process runs, shared by the layers that set them (the batch
runner, the grader, `notebooks fix`, the Colab set-up cell) and those that read them (helpers.interactive,
helpers.progress). Nothing else: this module imports nothing, so any module may read it.
"""

HEADLESS_ENV = "LABS_HEADLESS"   # "1": a batch run (runner, test suite, `notebooks fix`, grader): no widgets, no progress
SECTION_LOG_ENV = "LABS_SECTION_LOG"   # a file where helpers.device.requires appends each section's decision (batch runs)
FIGURES_LOG_ENV = "LABS_FIGURES_LOG"   # a file where helpers.bench appends each timing with its section (batch runs)
NOTEBOOK_ENV = "LABS_NOTEBOOK"   # the notebook's repository path, set by the Colab set-up cell: Colab names none
