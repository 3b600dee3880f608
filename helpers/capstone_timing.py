"""The capstone's timed goals: each side (the starting code, A; the project, B) timed in a fresh process of
its own, its CPU counted from outside its calls.

In one process a project could change what the starting code runs (wrap its Trainer.step, or a torch function
only the starting code calls) and forge a gain, and the grader's process (IPython, dynamo, the other goals'
state) weighed on whichever side ran in it. So each side runs in a fresh interpreter that imports torch, this
package and that side's sources, nothing of the other's; the child reports a digest of the sources it ran,
which the judge compares with the starting code's own (a project could rewrite the copy it was handed).

    with started(start.sources, "train_speed", w, calls=35, warmup=3) as side:
        side(5)            # 5 more calls there; the side's CPU seconds so far
        side.wall          # ... and the wall seconds those calls took
        side.digest        # sha256 of the sources the child imported

A side's CPU is everything its process and its descendants spent since it was ready, whenever they spent it (a
thread left running while the other side is timed, a DataLoader's or a pool's worker processes, a daemon that
left its parent: the child is their subreaper): its own and its reaped children's from getrusage, taken before
the project's code was imported, and its live descendants' from /proc. The kernel's count of the child's own
CPU (/proc/PID/stat, in clock ticks) bounds what the child reports: less is refused.

The child speaks one line at a time: the job as JSON in, "ready <digest> <cpu>" out, then "<calls> <nonce>"
in and "<nonce> <cpu>" out, until its input closes.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.abc
import importlib.util
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


class _FromSources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads a package and its modules from texts held in memory; the files in `folder` give them
    their paths (tracebacks, inspect), never their code: what runs is what was read, whatever a file says later."""

    def __init__(self, package: str, folder: Path, texts: dict[str, str]):
        self.package, self.folder, self.texts = package, folder, texts

    def find_spec(self, fullname: str, path=None, target=None):
        head, _, tail = fullname.rpartition(".")
        file = "__init__.py" if fullname == self.package else f"{tail}.py" if head == self.package else None
        if file not in self.texts:
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / file, loader=self,
                                                      submodule_search_locations=[] if file == "__init__.py" else None)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        text = self.texts[Path(module.__file__).name]
        exec(compile(text, module.__file__, "exec", dont_inherit=True), module.__dict__)


def import_sources(package: str, folder, texts: dict[str, str]):
    """Import `texts` (file name -> Python source) as the package `package` located in `folder`: its modules
    import each other relatively, from these texts only."""
    sys.meta_path.insert(0, _FromSources(package, Path(folder), dict(texts)))
    return importlib.import_module(package)


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of the live processes descended from `root` (root itself not included): every thread's run
    time from /proc/PID/task/TID/schedstat (nanoseconds). 0.0 where there is no /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            children.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
        except (OSError, IndexError, ValueError):     # a process that ended meanwhile
            continue
    total, todo = 0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def kernel_cpu_seconds(pid: int) -> float | None:
    """The kernel's count of a process's CPU seconds and its reaped children's (utime, stime, cutime and
    cstime of /proc/PID/stat, whole clock ticks); None where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def undercounted(reported: float, kernel: float | None, ticks: int = 3) -> bool:
    """Whether a child reported less CPU than the kernel counted for it over the same span, beyond the kernel's
    rounding (a few clock ticks, 2%)."""
    return kernel is not None and reported < kernel * 0.98 - ticks / os.sysconf("SC_CLK_TCK")


class Side:
    """A started child: calling it with n runs n more calls there and returns the side's CPU seconds since it
    was ready; `wall` holds the wall seconds of the last request, as seen here. Each request carries a nonce
    the reply must echo: a line written into the pipe by anyone else (a pipe can be reopened through /proc) is
    refused."""

    def __init__(self, process: subprocess.Popen, errors, name: str, deadline: float):
        self.process, self.errors, self.name, self.pid = process, errors, name, process.pid
        fields = self._reply(deadline).split()
        if len(fields) != 3 or fields[0] != "ready":
            self._failed(f"it said {' '.join(fields)[:200]!r} instead of being ready")
        self.digest, self.wall = fields[1], 0.0
        self._ready = (float(fields[2]), tree_cpu_seconds(self.pid), kernel_cpu_seconds(self.pid))
        self._own = self._ready[0]

    def __call__(self, calls: int, deadline: float = ANSWER_S) -> float:
        nonce = secrets.token_hex(8)
        t0 = time.perf_counter()
        self.process.stdin.write(f"{int(calls)} {nonce}\n")
        self.process.stdin.flush()
        fields = self._reply(deadline).split()
        self.wall = time.perf_counter() - t0
        if len(fields) != 2 or fields[0] != nonce:
            self._failed(f"its reply to {calls} calls did not echo the request's nonce with one number")
        self._own = float(fields[1])
        return self._own - self._ready[0] + tree_cpu_seconds(self.pid) - self._ready[1]

    def check(self) -> None:
        """RuntimeError if the child reported less CPU of its own since it was ready than the kernel counted."""
        kernel = kernel_cpu_seconds(self.pid)
        if self._ready[2] is not None and kernel is not None and undercounted(self._own - self._ready[0],
                                                                               kernel - self._ready[2]):
            self._failed(f"it reported {self._own - self._ready[0]:.3f} s of CPU where the kernel counted "
                         f"{kernel - self._ready[2]:.3f} s")

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
        raise RuntimeError(f"{self.name}'s timing process failed: {what}: "
                           f"{self.errors.read()[-1500:].strip() or 'nothing on its stderr'}")


@contextlib.contextmanager
def started(sources: dict[str, str], goal: str, w: dict, calls: int, warmup: int, name: str = "the project",
            python: str = sys.executable, environment: tuple = tuple(sorted(os.environ.items()))):
    """A child timing one side of `goal` on workload `w`: the project whose Python files are `sources`, `calls`
    calls built, `warmup` of them run before it says it is ready, on as many intra-op threads as this process
    has now. The child's code and interpreter and environment are this function's own, taken when this module
    was imported, before any project code ran (its constants and defaults, which the sandbox's tamper watch
    covers: a project that set ATEN_CPU_CAPABILITY in os.environ would otherwise run the starting code on
    slower kernels); its import path is the package's as installed (-I: not the working folder, which a
    submission writes), with the folder above the package appended last for a checkout never installed."""
    job = {"sources": sources, "goal": goal, "workload": w, "calls": calls, "warmup": warmup,
           "threads": torch.get_num_threads()}
    code = ("import sys, importlib.util\n"
            "if importlib.util.find_spec('helpers') is None:\n"
            f"    sys.path.append({str(Path(__file__).resolve().parents[1])!r})\n"
            "from helpers import capstone\n"
            "from helpers.capstone_timing import serve\n"
            "serve(capstone.load_project, capstone.timed_call)\n")
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            [python, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            text=True, bufsize=1, env=dict(environment)) as process:
        try:
            process.stdin.write(json.dumps(job) + "\n")
            process.stdin.flush()
            yield Side(process, errors, name, READY_S)
        finally:
            process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _own_cpu_seconds(usage=getattr(resource, "getrusage", None), self_=getattr(resource, "RUSAGE_SELF", 0),
                     children=getattr(resource, "RUSAGE_CHILDREN", 0)) -> float:
    """This process's CPU seconds and its reaped children's, through getrusage as it was when this module was
    imported (a project imported later cannot replace it here); process_time where there is none."""
    if usage is None:
        return time.process_time()
    mine, theirs = usage(self_), usage(children)
    return mine.ru_utime + mine.ru_stime + theirs.ru_utime + theirs.ru_stime


def _adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux): a worker whose parent exits, or a daemon
    that forks twice, stays below it, where its CPU is counted."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)     # PR_SET_CHILD_SUBREAPER


def serve(load_project, timed_call, cpu_seconds=_own_cpu_seconds) -> None:
    """The child's side: read the job, import the project from the job's sources (capstone.load_project; they
    are written into a fresh folder too, for tracebacks and inspect, but never imported from there), build and warm up the goal's call (capstone.timed_call), then run calls on
    request and answer with this process's CPU so far."""
    replies = open(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr      # what the project prints does not reach the replies
    job = json.loads(sys.stdin.readline())
    torch.set_num_threads(job["threads"])
    _adopt_orphans()
    with tempfile.TemporaryDirectory() as folder:
        for name, text in job["sources"].items():
            (Path(folder) / Path(name).name).write_text(text)
        project = load_project(folder, job["sources"])
        run = timed_call(project, job["goal"], job["workload"], job["calls"], folder)
        for _ in range(job["warmup"]):
            run()
        print("ready", digest(job["sources"]), repr(cpu_seconds()), file=replies)
        for line in sys.stdin:
            count, nonce = line.split()
            for _ in range(int(count)):
                run()
            print(nonce, repr(cpu_seconds()), file=replies)
