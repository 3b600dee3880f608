"""The capstone's timed goals: each side (the starting code, A; the project, B) timed in a fresh process of
its own, its CPU read by the kernel from outside.

In one process a project could change what the starting code runs (wrap its Trainer.step, or a torch function
only the starting code calls) and forge a gain, and the grader's process (IPython, dynamo, the other goals'
state) weighed on whichever side ran in it. So each side runs in a fresh interpreter that imports torch, this
package and that side's sources, nothing of the other's. The child says when it is ready with the job as it
read it (the judge checks the starting code's: its digest, goal, workload, threads) and runs calls on request;
it never says what they cost.

    with started(start.sources, "train_speed", w, calls=35, warmup=3) as side:
        side(5)                                   # 5 more calls there
        tree_cpu_seconds(os.getpid(), side.pid)   # [CPU of this process and the rest, CPU of the side's tree]

A side's CPU is read from the kernel (Linux: each process's CPU clock, its reaped children's from
/proc/PID/stat) over the child and all its descendants, whenever they spent it: a thread left running while
the other side is timed, a DataLoader's or a pool's worker processes, a daemon that left its parent (the child
is their subreaper). Where that cannot be read (COUNTED false: no /proc), the goals time wall clock.

The child speaks one line at a time: the job as JSON in, "ready <job as read, JSON>" out, then
"<calls> <nonce>" in and "<nonce> <calls run since ready>" out, or "outputs <nonce>" in and "<nonce> <every
call's fingerprint, JSON>" out (the judge compares them with the same calls run untimed), until its input
closes.
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

import torch

from helpers.validation import workloads

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


COUNTED = sys.platform.startswith("linux") and os.path.exists("/proc/self/stat")   # another process's CPU readable


def _stat(pid: int, read=os.read, open_=os.open, close=os.close) -> list[str]:
    """The fields of /proc/PID/stat after the command's name: [0] the state, [1] the parent, [11:15] utime,
    stime, cutime and cstime in clock ticks. Read with functions taken when this module was imported, as are
    the readers below (the grading process runs a project's code too)."""
    fd = open_(f"/proc/{pid}/stat", os.O_RDONLY)
    try:
        return read(fd, 4096).decode().rsplit(")", 1)[1].split()
    finally:
        close(fd)


def tree_cpu_seconds(root: int, *subtrees: int, listdir=os.listdir, cpu_clock=time.clock_gettime,
                     tick: float = 1 / os.sysconf("SC_CLK_TCK")) -> list[float]:
    """CPU seconds of the process `root` and its descendants, in one reading of /proc, split into
    [the processes below no subtree root, then each subtree's] (a subtree root is a descendant of `root`).
    A process counts with its CPU clock (every thread, those that ended too; a zombie's still) and what its
    children spent that it has reaped (cutime, cstime: clock ticks). A parent is read before its children, so
    a child reaped meanwhile is counted later, never twice."""
    parents: dict[int, list[int]] = {}
    for name in listdir("/proc"):
        if name.isdigit():
            try:
                parents.setdefault(int(_stat(int(name))[1]), []).append(int(name))
            except (OSError, IndexError, ValueError):      # a process that ended meanwhile
                continue
    totals = [0.0] * (1 + len(subtrees))
    todo = [(root, 0)]
    while todo:
        pid, index = todo.pop(0)
        index = 1 + subtrees.index(pid) if pid in subtrees else index
        try:
            reaped = sum(int(f) for f in _stat(pid)[13:15]) * tick
            totals[index] += cpu_clock(((~pid) << 3) | 2) + reaped     # the process's CPU clock (Linux)
        except (OSError, IndexError, ValueError):                      # it ended: its children may not have
            pass
        todo += [(child, index) for child in parents.get(pid, [])]
    return totals


def _read_line(fd: int, deadline: float, read=os.read, wait=select.select, now=time.monotonic) -> str:
    """One line from a pipe within `deadline` seconds ('' at its end); TimeoutError past it."""
    data, until = b"", now() + deadline
    while not data.endswith(b"\n"):
        if not wait([fd], [], [], max(until - now(), 0))[0]:
            raise TimeoutError(f"no answer within {deadline:.0f} s")
        chunk = read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


class Side:
    """A started child: calling it with n >= 1 runs n more calls there (the reply echoes the request's nonce
    and the count of calls it ran since it was ready: a reply written into its pipe by anyone else, or a
    request, which would change the count, is refused; the child's own pipes cannot be reopened through /proc
    by another process, it is not dumpable). `job` is the job as the child read it, less its
    sources, with their digest; `wall` the wall seconds of the last request, seen here."""

    def __init__(self, process: subprocess.Popen, errors, name: str, deadline: float):
        self.process, self.errors, self.name, self.pid = process, errors, name, process.pid
        self.calls, self.wall = 0, 0.0
        fields = self._reply(deadline).split(" ", 1)
        if len(fields) != 2 or fields[0] != "ready":
            self._failed(f"it said {' '.join(fields)[:200]!r} instead of being ready")
        self.job = json.loads(fields[1])

    def __call__(self, calls: int, deadline: float = ANSWER_S) -> None:
        t0 = time.perf_counter()
        nonce, fields = self._ask(str(int(calls)), deadline)
        self.wall = time.perf_counter() - t0
        self.calls += int(calls)
        if fields != [nonce, str(self.calls)]:
            self._failed(f"its reply to {calls} calls was not the request's nonce and {self.calls} calls in all")

    def outputs(self, deadline: float = ANSWER_S) -> list[float]:
        """The fingerprints of every call's output so far, warm-up included, in order (fingerprint)."""
        nonce, fields = self._ask("outputs", deadline)
        if len(fields) != 2 or fields[0] != nonce:
            self._failed("its reply to a request for outputs was not the request's nonce and a list")
        return json.loads(fields[1])

    def _ask(self, request: str, deadline: float, token=secrets.token_hex) -> tuple[str, list[str]]:
        nonce = token(8)
        try:
            self.process.stdin.write(f"{request} {nonce}\n")
            self.process.stdin.flush()
        except OSError as error:
            self._failed(f"it took no request ({error})")
        return nonce, self._reply(deadline).split()

    def _reply(self, deadline: float) -> str:
        try:
            line = _read_line(self.process.stdout.fileno(), deadline)
        except TimeoutError as error:
            self.process.kill()
            self._failed(str(error))
        if not line:
            self._failed("it ended")
        return line

    def _failed(self, what: str):
        self.errors.seek(0)
        raise RuntimeError(f"{self.name}'s timing process failed: {what}: "
                           f"{self.errors.read()[-1500:].strip() or 'nothing on its stderr'}")


def paired_rounds(side_a, side_b, rounds: int, calls: int, settle: float = 0.05,
                  here: int = os.getpid()) -> tuple[list[float], list[float], str]:
    """Each round runs `calls` calls of each side back to back, A first in even rounds and B first in odd ones,
    with `settle` seconds before each side. Each side is a started child (Side).
    Returns each side's seconds per call in each round, round i of A paired with round i of B, and the clock:
    CPU time at one intra-op thread, as the validation pipeline times (helpers.validation.workloads.
    timing_clock: time spent descheduled by other work on the machine does not count), else wall time (also
    where another process's CPU cannot be read). On the CPU clock a round charges a side what its process tree
    spent since its previous round, whenever it spent it (a thread or a worker left running while the other
    side was timed), the last round also what it spent after it; and B what this process (`here`, where the
    project's code was loaded too) and its other descendants spent, less this thread's measuring."""
    clock = workloads.timing_clock(torch.device("cpu")) if COUNTED else "wall"
    sides = {"a": side_a, "b": side_b}

    def spent() -> dict[str, float]:
        if clock != "cpu":       # /proc is not read at all: it may not be there
            return {"a": 0.0, "b": 0.0, "rest": 0.0}
        rest, a, b = tree_cpu_seconds(here, side_a.pid, side_b.pid)
        return {"a": a, "b": b, "rest": rest - time.thread_time()}
    per_call, last = {"a": [], "b": []}, spent()
    for r in range(rounds):
        for key in ("ab" if r % 2 == 0 else "ba"):
            time.sleep(settle)
            sides[key](calls)
            now = spent()
            per_call[key].append((now[key] - last[key] if clock == "cpu" else sides[key].wall) / calls)
            last[key] = now[key]
        per_call["b"][-1] += (now["rest"] - last["rest"]) / calls
        last["rest"] = now["rest"]
    time.sleep(settle)
    now = spent()                # what was spent after the last round is that round's
    for key in ("a", "b", "rest"):
        per_call["b" if key == "rest" else key][-1] += (now[key] - last[key]) / calls
    return per_call["a"], per_call["b"], clock


@contextlib.contextmanager
def started(sources: dict[str, str], goal: str, w: dict, calls: int, warmup: int, name: str = "the project",
            python: str = sys.executable, environment: tuple = tuple(sorted(os.environ.items())),
            dumps=json.dumps, threads=torch.get_num_threads):
    """A child timing one side of `goal` on workload `w`: the project whose Python files are `sources`, `calls`
    calls built, `warmup` of them run before it says it is ready, on as many intra-op threads as this process
    has now. The child's code and interpreter and environment are this function's own, taken when this module
    was imported, before any project code ran (its constants and defaults, which the sandbox's tamper watch
    covers: a project that set ATEN_CPU_CAPABILITY in os.environ would otherwise run the starting code on
    slower kernels); its import path is the package's as installed (-I: not the working folder, which a
    submission writes), with the folder above the package appended last for a checkout never installed."""
    job = {"sources": sources, "goal": goal, "workload": w, "calls": calls, "warmup": warmup, "threads": threads()}
    code = ("import sys, importlib.util\n"
            "if sys.platform.startswith('linux'):   # PR_SET_DUMPABLE 0: no other process opens its pipes\n"
            "    import ctypes\n"
            "    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"
            "if importlib.util.find_spec('helpers') is None:\n"
            f"    sys.path.append({str(Path(__file__).resolve().parents[1])!r})\n"
            "from helpers import capstone\n"
            "from helpers.capstone_timing import serve\n"
            "serve(capstone.load_project, capstone.timed_call)\n")
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            [python, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            text=True, env=dict(environment)) as process:
        try:
            try:
                process.stdin.write(dumps(job) + "\n")
                process.stdin.flush()
            except OSError:
                pass           # it ended: Side says so, with its stderr
            yield Side(process, errors, name, READY_S)
        finally:
            with contextlib.suppress(OSError):
                process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def fingerprint(output) -> list[float]:
    """A call's output in a number or two, enough to tell it from another: a loss as itself, a tensor (logits)
    as its norm and its projection on a fixed unit vector (both on the scale of the norm)."""
    if isinstance(output, torch.Tensor):
        flat = output.detach().to(torch.float64).flatten()
        fixed = torch.arange(flat.numel(), dtype=torch.float64).cos()
        return [float(flat.norm()), float(flat @ fixed / fixed.norm().clamp_min(1))]
    return [float(output)]


def _adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux): a worker whose parent exits, or a daemon
    that forks twice, stays below it, where its CPU is counted."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)     # PR_SET_CHILD_SUBREAPER


def serve(load_project, timed_call) -> None:
    """The child's side: read the job, import the project from the job's sources (capstone.load_project; they
    are written into a fresh folder too, for tracebacks and inspect, but never imported from there), build
    and warm up the goal's call (capstone.timed_call), say it is ready with the job as read, then run calls on
    request. What the calls cost is read from outside (tree_cpu_seconds), not said here."""
    replies = open(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr      # what the project prints does not reach the replies
    requests = sys.stdin
    job = json.loads(requests.readline())
    torch.set_num_threads(job["threads"])
    _adopt_orphans()
    with tempfile.TemporaryDirectory() as folder:
        for name, text in job["sources"].items():
            (Path(folder) / Path(name).name).write_text(text)
        project = load_project(folder, job["sources"])
        run = timed_call(project, job["goal"], job["workload"], job["calls"], folder)
        outputs = []
        for _ in range(job["warmup"]):
            outputs += fingerprint(run())
        echo = {k: v for k, v in job.items() if k != "sources"} | {"digest": digest(job["sources"]),
                                                                     "threads": torch.get_num_threads()}
        print("ready", json.dumps(echo), file=replies)
        done = 0
        for line in requests:
            count, nonce = line.split()
            if count == "outputs":      # the last request
                print(nonce, json.dumps(outputs, separators=(",", ":")), file=replies)
                break
            if int(count) < 1:
                raise ValueError(f"a request for {count} calls")
            for _ in range(int(count)):
                outputs += fingerprint(run())
            done += int(count)
            print(nonce, done, file=replies)
