"""The capstone's starting code, timed in a process of its own (side A of a timed goal), and the CPU each
side's worker processes spend.

In one process a project can change what the starting code runs (wrap its Trainer.step, or a torch function
only the starting code calls) and forge a gain the tamper watch does not see. So side A runs in a fresh
interpreter that imports torch, this package and the starting code's sources, nothing of the project's; the
project (side B) is timed where it was loaded. The child reports a digest of the sources it ran, which the
judge compares with the starting code's own (a project could rewrite the copy it was handed).

    with started(start, "train_speed", w, calls=35, warmup=3) as baseline:
        baseline(5)          # the seconds of 5 more calls, on the child's clock
        baseline.digest      # sha256 of the sources the child imported

The child speaks one line at a time: the job as JSON in, "ready <digest> <clock>" out, then a number of calls
in and their seconds out, until its input closes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def digest(sources: dict[str, str]) -> str:
    """sha256 of a project's Python files, by name and text."""
    return hashlib.sha256("".join(f"{name}\0{text}\0" for name, text in sorted(sources.items())).encode()).hexdigest()


def sources(folder) -> dict[str, str]:
    """A project folder's top-level Python files by name: what the grader hands the sandbox of a project."""
    return {p.name: p.read_text() for p in sorted(Path(folder).glob("*.py"))}


def tree_cpu_seconds(root: int, without: int | None = None) -> float:
    """CPU seconds of the live processes descended from `root` (root itself not included), leaving out
    `without` and its descendants: every thread's run time from /proc/PID/task/TID/schedstat (nanoseconds).
    The CPU clock (getrusage) counts one process; a side's worker processes (a DataLoader's, or a pool a step
    hands its work to) are its cost too. 0.0 where there is no /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            children.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
        except (OSError, IndexError, ValueError):     # a process that ended meanwhile
            continue
    total, todo = 0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid == without:
            continue
        todo += children.get(pid, [])
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


class Baseline:
    """A started child: calling it with n runs n more calls there and returns their seconds."""

    def __init__(self, process: subprocess.Popen, errors, ready: str):
        self.process, self.errors = process, errors
        fields = ready.split()
        if len(fields) != 3 or fields[0] != "ready":
            self._failed(f"it said {ready[:200]!r} instead of being ready")
        self.digest, self.clock = fields[1], fields[2]
        self.pid = process.pid

    def __call__(self, calls: int) -> list[float]:
        self.process.stdin.write(f"{int(calls)}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self._failed("it ended")
        return [float(t) for t in line.split()]

    def _failed(self, what: str):
        self.errors.seek(0)
        raise RuntimeError(f"the starting code's timing process failed: {what}: "
                           f"{self.errors.read()[-1500:].strip() or 'nothing on its stderr'}")


@contextlib.contextmanager
def started(start, goal: str, w: dict, calls: int, warmup: int, python: str = sys.executable):
    """A child timing the starting code's side of `goal` on workload `w`: `calls` calls built, `warmup` of them
    run before it says it is ready, on as many intra-op threads as this process has now. The child's code and
    interpreter are this function's own (its constants and defaults, which the sandbox's tamper watch covers);
    its import path is the package's as installed (-I: not the working folder, which a submission writes),
    with the folder above the package appended last for a checkout that was never installed."""
    job = {"sources": sources(start.folder), "goal": goal, "workload": w, "calls": calls, "warmup": warmup,
           "threads": torch.get_num_threads()}
    code = ("import sys, importlib.util\n"
            "if importlib.util.find_spec('helpers') is None:\n"
            f"    sys.path.append({str(Path(__file__).resolve().parents[1])!r})\n"
            "from helpers import capstone\n"
            "from helpers.capstone_baseline import serve\n"
            "serve(capstone.load_project, capstone.timed_call)\n")
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            [python, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            text=True, bufsize=1) as process:
        try:
            process.stdin.write(json.dumps(job) + "\n")
            process.stdin.flush()
            yield Baseline(process, errors, process.stdout.readline())
        finally:
            process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def serve(load_project, timed_call) -> None:
    """The child's side: read the job, import the starting code from its sources into a fresh folder
    (capstone.load_project), build and warm up the goal's call (capstone.timed_call), then time calls on
    request (the clock of helpers.validation.workloads)."""
    from helpers.validation import workloads
    replies = open(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr      # what the starting code prints does not reach the replies
    job = json.loads(sys.stdin.readline())
    torch.set_num_threads(job["threads"])
    with tempfile.TemporaryDirectory() as folder:
        for name, text in job["sources"].items():
            (Path(folder) / Path(name).name).write_text(text)
        start = load_project(folder)
        run = timed_call(start, job["goal"], job["workload"], job["calls"], folder)
        for _ in range(job["warmup"]):
            run()
        clock = workloads.timing_clock(torch.device("cpu"))
        now = workloads.cpu_seconds if clock == "cpu" else time.perf_counter
        print("ready", digest(job["sources"]), clock, file=replies)
        for line in sys.stdin:
            times = []
            for _ in range(int(line)):
                t0 = now()
                run()
                times.append(now() - t0)
            print(" ".join(repr(t) for t in times), file=replies)
