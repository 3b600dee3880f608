"""The operating system's isolation of one submission: bubblewrap's namespaces and a cgroup.

Why bubblewrap (`bwrap`, Flatpak's sandbox; `apt install bubblewrap`, `dnf install bubblewrap`): one small,
well-kept binary that builds the sandbox's file system from nothing (only what is bound exists inside, read-only
here), unshares the user, mount, PID, network, IPC and UTS namespaces, drops every capability and kills the
sandbox when the grader dies (--die-with-parent). The kernel's own unshare(1) gives the same namespaces, but its
mount table would be built by a script of ours. Cgroups are not bubblewrap's: the grader writes them itself
(cgroup v1 or v2) where it may (as root, or in a delegated subtree), for memory, processes and CPU.

Inside: uid 65534, the sandbox's own /proc (it sees only its own processes), no network but a loopback,
a fresh /tmp and /dev/shm (tmpfs, bounded), the working folder /tmp/work; read-only: the system's /usr and
libraries, the few files of /etc that Python, torch and a compiler read, the Python that runs the grader (its
prefixes and import path) and the installed `helpers` package without the grading specs and without compiled
caches. A lab that must write outside its working folder (a build cache) gets a bounded tmpfs there, filled
from a read-only copy of the host's cache: nothing the submission writes reaches the host's disk. Not inside:
the repository (solutions, labs, `.git`, `runs/`), the submissions, the grader's output, the user's home.

Never host root. bwrap maps the sandbox's user to the user who started it, so a grader started as root would
run the submission as host root in a user namespace (owner of every root file bound inside, and of what it
writes). As root the grader therefore makes no user namespace: bwrap sets the sandbox up with root's rights,
keeps only the two capabilities that setpriv needs, and setpriv (util-linux) becomes uid SANDBOX_UID, with no
groups and no capabilities, before the submission's interpreter starts (bwrap's no-new-privileges flag keeps it
so). Started by another user, the sandbox is that user's, in a user namespace that can make no other.
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

SANDBOX_UID = 65534                     # nobody: inside, and on the host when the grader is root
WORK = "/tmp/work"                      # the submission's working folder, inside
SEEDS = "/tmp/seeds"                    # read-only copies of what a scratch folder starts with, inside
TMPFS_MB = 512                          # each of /tmp, /dev/shm and a scratch folder, inside
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# what the loader, Python, torch and a compiler read from /etc (no secrets: never /etc whole)
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group", "nsswitch.conf",
             "hosts", "alternatives", "os-release")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PIDS_MAX = 512                          # threads count too: torch's pools, compile workers
PACKAGE = Path(helpers.__file__).resolve().parent
HIDDEN_IN_PACKAGE = ("grading/specs",)   # the references; with every __pycache__ of the package


def bwrap() -> str | None:
    return shutil.which("bwrap")


def setpriv() -> str | None:
    return shutil.which("setpriv")


def is_root() -> bool:
    return os.geteuid() == 0


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
    if is_root() and setpriv() is None:
        return "as root the grader drops to an unprivileged user with setpriv, which is missing: apt install util-linux"
    probe = sandbox_argv([sys.executable, "-I", "-c", "import helpers"], threads=1)
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"bwrap could not create the namespaces here ({last}); unprivileged user namespaces may be off"
    return None


NO_CGROUP = ("no cgroup (the grader may create one as root or in a delegated cgroup subtree), so memory, "
             "processes and CPU were held only by the grader's watch")


def row_isolation(problem: str | None, cgroup: bool) -> str:
    """A row's word on isolation: "isolated" only with every layer in place (namespaces, a user that is not
    the host's root, a cgroup of its own), else which layer was missing."""
    if problem is not None:
        return f"not isolated: {problem}"
    return "isolated" if cgroup else f"partly isolated: namespaces and an unprivileged user, but {NO_CGROUP}"


def class_isolation(problem: str | None, rows: list[dict]) -> str:
    """The class report's word on isolation: the layers each submission had."""
    if problem is not None:
        return f"not isolated: {problem}"
    user = (f"uid {SANDBOX_UID} on the host (the grader runs as root and drops to it)" if is_root()
            else "the grader's own user, in a user namespace that can make no other")
    partly = sum(r["isolation"] != "isolated" for r in rows)
    cgroups = ("a cgroup per submission (memory, processes, CPU)" if not partly else
               f"{NO_CGROUP} for {partly} of {len(rows)} submissions")
    return (f"{'partly isolated' if partly else 'isolated'}: bubblewrap's namespaces (mount, PID, network, IPC, "
            f"UTS), {user}, {cgroups}")


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


def _parent_dirs(dests: list[str]) -> list[str]:
    """The folders above each bound path that no bind provides, outermost first: made traversable (0755), where
    bwrap would copy their host mode (root's home is 0700)."""
    parents = {str(p) for d in dests for p in Path(d).parents if str(p) != "/"}
    return sorted((p for p in parents if not any(p == d or p.startswith(d + "/") for d in dests)),
                  key=lambda p: p.count("/"))


def sandbox_argv(command: list[str], *, threads: int, env: dict | None = None,
                 scratch: dict[str, Path | None] | None = None) -> list[str]:
    """bwrap's command line for `command`: the namespaces, the read-only system and Python, the package without
    what is hidden, tmpfs for /tmp and /dev/shm, and for each `scratch` folder (inside path -> the host folder
    it starts as a copy of, or None) a bounded tmpfs, with the host folder bound read-only under SEEDS."""
    argv = [bwrap(), "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "grading", "--clearenv", "--cap-drop", "ALL"]
    if is_root():   # no user namespace: it would map the sandbox's user to host root (see the module)
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        command = [setpriv(), f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                   "--inh-caps=-all", "--", *command]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    for name, value in sandbox_env(threads, env).items():
        argv += ["--setenv", name, value]
    # the fresh /tmp first: what is bound below may live under /tmp (a clone, a venv) and must stay visible
    argv += ["--perms", "1777", "--size", str(TMPFS_MB * 2**20), "--tmpfs", "/tmp"]
    binds = [(path, path) for path in SYSTEM_DIRS if os.path.lexists(path)]
    binds += [(f"/etc/{name}", f"/etc/{name}") for name in ETC_FILES if os.path.exists(f"/etc/{name}")]
    binds += [(str(path), str(path)) for path in _python_paths()] + [(str(PACKAGE), str(PACKAGE))]
    binds += [(str(scratch[inside]), seed) for inside, seed in scratch_seeds(scratch or {}).items()]
    for path in _parent_dirs([dest for _, dest in binds] + list(scratch or {})):
        argv += ["--perms", "0755", "--dir", path]
    for host, dest in binds:
        argv += ["--ro-bind-try" if host in SYSTEM_DIRS else "--ro-bind", host, dest]
    for path in _hidden_package_paths():
        argv += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(TMPFS_MB * 2**20), "--tmpfs", "/dev/shm",
             "--perms", "0777", "--dir", WORK, "--perms", "0777", "--dir", "/tmp/home", "--chdir", WORK]
    for inside in scratch or {}:
        argv += ["--perms", "0777", "--size", str(TMPFS_MB * 2**20), "--tmpfs", inside]
    return argv + ["--", *command]


def scratch_seeds(scratch: dict[str, Path | None]) -> dict[str, str]:
    """Inside: scratch folder -> where its starting copy is bound (what the sandbox copies in first)."""
    return {inside: f"{SEEDS}/{i}" for i, (inside, host) in enumerate(scratch.items()) if host}


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


def remove_stale_cgroups() -> None:
    """Remove the cgroups of graders that died (named PID-HEX by create_cgroup), with what is left in them."""
    parents = [CGROUP_ROOT / "labs-grade"] + [CGROUP_ROOT / c / "labs-grade" for c in ("memory", "pids", "cpu", "cpuacct")]
    for parent in parents:
        for d in parent.iterdir() if parent.is_dir() else ():
            pid = d.name.split("-")[0]
            if d.is_dir() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                remove_cgroup({"dirs": [d], "procs": [d / "cgroup.procs"]})


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
