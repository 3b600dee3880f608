"""The operating system's isolation of one submission: bubblewrap's namespaces and a cgroup.

Why bubblewrap (`bwrap`, Flatpak's sandbox; `apt install bubblewrap`, `dnf install bubblewrap`): one small,
well-kept binary that builds the sandbox's file system from nothing (only what is bound exists inside, read-only
here), unshares the user, mount, PID, network, IPC and UTS namespaces, drops every capability and kills the
sandbox when the grader dies (--die-with-parent). The kernel's own unshare(1) gives the same namespaces, but its
mount table would be built by a script of ours. Cgroups are not bubblewrap's: the grader writes them itself
(cgroup v1 or v2) where it may (as root, or in a delegated subtree), for memory, processes and CPU.

Inside: uid 65534, the sandbox's own /proc (it sees only its own processes), no network but a loopback,
a fresh /tmp and /dev/shm (tmpfs, bounded), the working folder /tmp/work; read-only: the system's /usr, /etc
and libraries, the Python that runs the grader (its prefixes and import path) and the installed `helpers`
package without the grading specs and without compiled caches. Not inside: the repository (solutions,
labs, `.git`, `runs/`), the submissions, the grader's output, the user's home.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers

SANDBOX_UID = 65534                     # nobody
WORK = "/tmp/work"                      # the submission's working folder, inside
TMPFS_MB = 512                          # each of /tmp and /dev/shm, inside
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PIDS_MAX = 512                          # threads count too: torch's pools, compile workers
PACKAGE = Path(helpers.__file__).resolve().parent
HIDDEN_IN_PACKAGE = ("grading/specs.py",)   # with every __pycache__ of the package


def bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """None when this machine can isolate a submission, else why not (the grader then warns and marks
    every row 'not isolated'). LABS_GRADE_ISOLATION=off turns isolation off on purpose."""
    if os.environ.get("LABS_GRADE_ISOLATION", "").lower() in ("off", "0", "no"):
        return "turned off (LABS_GRADE_ISOLATION=off)"
    if sys.platform != "linux":
        return f"namespaces are Linux's; this is {sys.platform}"
    if bwrap() is None:
        return "bubblewrap (bwrap) is not installed: apt install bubblewrap (or dnf, pacman, apk)"
    probe = sandbox_argv([sys.executable, "-I", "-c", "import helpers"], threads=1)
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"bwrap could not create the namespaces here ({last}); unprivileged user namespaces may be off"
    return None


@functools.lru_cache(maxsize=1)
def _python_paths() -> list[Path]:
    """What the sandbox's interpreter needs: its prefixes and the import path it has under -I (so not the
    grader's folder, nor PYTHONPATH), without the package's repository or a folder above it (the package is
    bound alone; a venv inside the repository is bound)."""
    probe = subprocess.run([sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                           capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    repo, prefix = PACKAGE.parent, Path(sys.prefix).resolve()
    paths = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths |= {Path(p).resolve() for p in json.loads(probe.stdout) if p and Path(p).exists()}
    kept = [p for p in paths if p != repo and p not in repo.parents and (repo not in p.parents or p == prefix
                                                                           or prefix in p.parents)]
    return sorted(p for p in kept if not any(q in p.parents for q in kept))   # the outermost of nested paths


def _hidden_package_paths() -> list[Path]:
    caches = sorted(PACKAGE.rglob("__pycache__"))
    return [PACKAGE / rel for rel in HIDDEN_IN_PACKAGE if (PACKAGE / rel).exists()] + caches


def sandbox_env(threads: int, extra: dict | None = None) -> dict[str, str]:
    """The sandbox's whole environment: nothing of the grader's (tokens, paths) but what is named here."""
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ", "TRITON_INTERPRET")
            or k.startswith("LABS_")}
    return {**keep, "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
            "TMPDIR": "/tmp", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONDONTWRITEBYTECODE": "1", **(extra or {})}


def sandbox_argv(command: list[str], *, threads: int, env: dict | None = None,
                 writable: dict[str, Path] | None = None) -> list[str]:
    """bwrap's command line for `command`: the namespaces, the read-only system and Python, the package without
    what is hidden, tmpfs for /tmp and /dev/shm, and each `writable` host folder bound at its inside path."""
    argv = [bwrap(), "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "grading", "--clearenv"]
    for name, value in sandbox_env(threads, env).items():
        argv += ["--setenv", name, value]
    # the fresh /tmp first: what is bound below may live under /tmp (a clone, a venv) and must stay visible
    argv += ["--size", str(TMPFS_MB * 2**20), "--tmpfs", "/tmp"]
    for path in SYSTEM_DIRS:
        argv += ["--ro-bind-try", path, path]
    for path in _python_paths():
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--ro-bind", str(PACKAGE), str(PACKAGE)]
    for path in _hidden_package_paths():
        argv += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(TMPFS_MB * 2**20), "--tmpfs", "/dev/shm",
             "--dir", WORK, "--dir", "/tmp/home", "--chdir", WORK]
    for inside, host in (writable or {}).items():
        argv += ["--bind", str(host), inside]
    return argv + ["--", *command]


# --- cgroups: memory, processes and CPU of one submission -----------------------------------------

def create_cgroup(name: str, *, memory_mb: float, cpus: int) -> dict | None:
    """A cgroup for one submission (v2, or v1's memory, pids, cpu and cpuacct hierarchies): a hard memory
    limit (tmpfs pages and re-parented processes included), PIDS_MAX tasks, `cpus` CPUs' worth of time.
    None where the grader may not create one (then only the watcher's limits apply)."""
    limit = str(int(memory_mb * 2**20))
    try:
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            parent = CGROUP_ROOT / "labs-grade"
            parent.mkdir(exist_ok=True)
            (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            d = parent / name
            d.mkdir()
            (d / "memory.max").write_text(limit)
            (d / "pids.max").write_text(str(PIDS_MAX))
            (d / "cpu.max").write_text(f"{cpus * 100000} 100000")
            return {"dirs": [d], "procs": [d / "cgroup.procs"], "version": 2}
        dirs = {c: CGROUP_ROOT / c / "labs-grade" / name for c in ("memory", "pids", "cpu", "cpuacct")}
        if not all((CGROUP_ROOT / c).is_dir() for c in dirs):
            return None
        for d in dirs.values():
            d.mkdir(parents=True)
        (dirs["memory"] / "memory.limit_in_bytes").write_text(limit)
        (dirs["pids"] / "pids.max").write_text(str(PIDS_MAX))
        (dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
        (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(cpus * 100000))
        return {"dirs": list(dirs.values()), "procs": [d / "cgroup.procs" for d in dirs.values()], "version": 1,
                "memory": dirs["memory"], "cpuacct": dirs["cpuacct"]}
    except OSError:
        return None


def in_cgroup(cgroup: dict | None, argv: list[str]) -> list[str]:
    """argv started inside the cgroup: a shell writes its own pid into each cgroup.procs, then execs argv
    (so nothing runs outside it, not even for an instant)."""
    if cgroup is None:
        return argv
    joins = " && ".join(f"echo $$ > '{p}'" for p in cgroup["procs"])
    return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *argv]


def cgroup_cpu_seconds(cgroup: dict) -> float:
    """CPU time used by every process the submission ever ran (ended ones included)."""
    try:
        if cgroup["version"] == 2:
            stat = dict(line.split() for line in (cgroup["dirs"][0] / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int((cgroup["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
    except (OSError, KeyError, ValueError):
        return 0.0


def cgroup_oom_killed(cgroup: dict) -> bool:
    """Whether the kernel killed a process of the cgroup for memory."""
    try:
        if cgroup["version"] == 2:
            events = dict(line.split() for line in (cgroup["dirs"][0] / "memory.events").read_text().splitlines())
            return int(events.get("oom_kill", 0)) > 0
        control = dict(line.split() for line in (cgroup["memory"] / "memory.oom_control").read_text().splitlines())
        return int(control.get("oom_kill", 0)) > 0
    except (OSError, ValueError):
        return False


def remove_cgroup(cgroup: dict | None) -> None:
    """Kill whatever is left in the cgroup, then remove it."""
    if cgroup is None:
        return
    for procs in cgroup["procs"]:
        try:
            pids = procs.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    for d in cgroup["dirs"]:
        for _ in range(100):   # busy while the killed processes exit
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)
