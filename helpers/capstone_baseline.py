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
import secrets
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import resource
except ImportError:        # Windows
    resource = None

import torch


READY_S = 600      # the most seconds the child may take to import torch, build its side and warm it up
ANSWER_S = 300     # ... and to answer one request for calls


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


def reaped_cpu_seconds() -> float:
    """CPU seconds of this process's children that ended and were waited for (a pool whose workers exit after
    each task), which no live process shows any more. 0.0 where there is no getrusage."""
    if resource is None:
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Baseline:
    """A started child: calling it with n runs n more calls there and returns their seconds. Each request
    carries a nonce the reply must echo, with exactly n times: a line written into the pipe by anyone else
    (the pipe can be reopened through /proc) is refused, not read as the starting code's times."""

    def __init__(self, process: subprocess.Popen, errors, deadline: float):
        self.process, self.errors, self.pid = process, errors, process.pid
        fields = self._reply(deadline).split()
        if len(fields) != 3 or fields[0] != "ready":
            self._failed(f"it said {' '.join(fields)[:200]!r} instead of being ready")
        self.digest, self.clock = fields[1], fields[2]

    def __call__(self, calls: int, deadline: float = ANSWER_S) -> list[float]:
        nonce = secrets.token_hex(8)
        self.process.stdin.write(f"{int(calls)} {nonce}\n")
        self.process.stdin.flush()
        fields = self._reply(deadline).split()
        if len(fields) != calls + 1 or fields[0] != nonce:
            self._failed(f"its reply to {calls} calls was not {calls} times with the request's nonce")
        return [float(t) for t in fields[1:]]

    def _reply(self, deadline: float) -> str:
        if os.name == "posix" and not select.select([self.process.stdout], [], [], deadline)[0]:
            self.process.kill()
            self._failed(f"no answer within {deadline:.0f} s")
        line = self.process.stdout.readline()
        if not line:
            self._failed("it ended")
        return line

    def _failed(self, what: str):
        self.errors.seek(0)
        raise RuntimeError(f"the starting code's timing process failed: {what}: "
                           f"{self.errors.read()[-1500:].strip() or 'nothing on its stderr'}")


@contextlib.contextmanager
def started(start, goal: str, w: dict, calls: int, warmup: int, python: str = sys.executable,
            environment: tuple = tuple(sorted(os.environ.items()))):
    """A child timing the starting code's side of `goal` on workload `w`: `calls` calls built, `warmup` of them
    run before it says it is ready, on as many intra-op threads as this process has now. The child's code and
    interpreter and environment are this function's own, taken when this module was imported, before any
    project code ran (its constants and defaults, which the sandbox's tamper watch covers: a project that set
    ATEN_CPU_CAPABILITY in os.environ would otherwise run the starting code on slower kernels);
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
            text=True, bufsize=1, env=dict(environment)) as process:
        try:
            process.stdin.write(json.dumps(job) + "\n")
            process.stdin.flush()
            yield Baseline(process, errors, READY_S)
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
            count, nonce = line.split()
            times = []
            for _ in range(int(count)):
                t0 = now()
                run()
                times.append(now() - t0)
            print(nonce, *(repr(t) for t in times), file=replies)
