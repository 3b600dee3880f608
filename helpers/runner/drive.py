"""Run one notebook with papermill in this process (the kernel is this process's child) and write
what happened as JSON. helpers.runner.job starts it, watches its memory and time, and kills it when
a limit is passed.

    python -m helpers.runner.drive JOB.json      # writes JOB.json's "result" path

Imports no torch: it starts in a fraction of a second, and its own memory stays out of the kernel's.
"""
from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from helpers.files import write_text_atomic

KERNEL_START_FAILED = "Kernel died before replying to kernel_info"


def drive(job: dict) -> dict:
    # jsonschema imports the optional rfc3987_syntax, which builds a grammar on import (1-2 s of CPU
    # per notebook); nbformat's validation never needs it
    sys.modules.setdefault("rfc3987_syntax", None)
    import papermill
    from jupyter_client.manager import AsyncKernelManager
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    launched = []   # the kernel's Popen: its exit code tells os._exit(n) from a signal

    class RecordingKernelManager(AsyncKernelManager):
        async def _async_post_start_kernel(self, **kw):   # the hook start_kernel awaits
            await super()._async_post_start_kernel(**kw)
            launched.append(self.provisioner.process)

    def execute():
        papermill.execute_notebook(job["input"], job["output"], parameters=job["parameters"], cwd=job["cwd"],
                                   execution_timeout=job["cell_timeout"], progress_bar=False,
                                   kernel_name="python3", kernel_manager_class=RecordingKernelManager)

    result: dict = {"outcome": "passed"}
    restarted = None
    try:
        try:
            execute()
        except RuntimeError as exc:
            # seen when two kernels start at once on a loaded machine: the new kernel exits before any
            # cell ran, so starting it once more is safe; the record says it happened
            if KERNEL_START_FAILED not in str(exc):
                raise
            restarted = str(exc)
            execute()
    except papermill.PapermillExecutionError as exc:
        result = {"outcome": "cell-error", "cell": exc.cell_index, "ename": exc.ename, "evalue": exc.evalue}
    except CellTimeoutError as exc:
        result = {"outcome": "cell-timeout", "evalue": str(exc).split("\n")[0]}
    except DeadKernelError as exc:
        result = {"outcome": "kernel-died", "evalue": str(exc)}
    except Exception as exc:   # anything else is the runner's own failure, reported as such
        result = {"outcome": "runner-error", "ename": type(exc).__name__, "evalue": str(exc)[:2000]}
    if restarted:
        result["kernel_restarted"] = restarted
    result["kernel_exit"] = launched[-1].poll() if launched else None
    # the largest resident set of any waited-for child: the kernel (kilobytes on Linux)
    result["kernel_max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    return result


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    write_text_atomic(json.dumps(drive(job)), job["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
