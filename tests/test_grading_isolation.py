"""The operating system's isolation of a submission, checked from the host: the sandboxed interpreter is never
host root, sees only what it needs of /etc, cannot read a root-only file bound inside, and what it writes outside
its working folder stays in a bounded tmpfs; a row says "isolated" only with every layer in place."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.grading import isolation

pytestmark = pytest.mark.skipif(isolation.isolation_problem() is not None,
                                reason=f"no isolation here: {isolation.isolation_problem()}")
SCRATCH = "/scratch/ext"

# What the sandboxed interpreter sees of itself and of the folders it was given; it then waits for stdin to close.
PROBE = r'''
import json, os, shutil, sys
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
seen = {"uid": os.getuid(), "no_new_privs": status["NoNewPrivs"].strip(), "cap_eff": status["CapEff"].strip(),
        "etc": sorted(os.listdir("/etc"))}
try:
    seen["secret"] = open("/tmp/seeds/0/secret").read()
except OSError as exc:
    seen["secret"] = type(exc).__name__
seen["seed_copy"] = open("/tmp/seeds/0/public").read()
os.makedirs(SCRATCH, exist_ok=True)
shutil.copy("/bin/true", SCRATCH + "/planted")
os.chmod(SCRATCH + "/planted", 0o4755)
written, chunk = 0, b"0" * (64 << 20)
try:
    with open(SCRATCH + "/filler", "wb") as f:
        while written < (2 << 30):
            f.write(chunk)
            f.flush()
            written += len(chunk)
except OSError as exc:
    seen["full"] = exc.errno
seen["written_mb"] = written >> 20
print(json.dumps(seen), flush=True)
sys.stdin.read()
'''.replace("SCRATCH", repr(SCRATCH))


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory):
    """One sandbox run of PROBE: what it printed, the host users of its processes, and its seed folder."""
    seed = tmp_path_factory.mktemp("seed")
    seed.chmod(0o755)
    (seed / "public").write_text("public")
    (seed / "secret").write_text("root only")
    (seed / "secret").chmod(0o600)
    argv = isolation.sandbox_argv([sys.executable, "-I", "-c", PROBE], threads=1, scratch={SCRATCH: seed})
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    line = proc.stdout.readline()
    users = {p.name(): p.uids().real for p in psutil.Process(proc.pid).children(recursive=True)}
    proc.stdin.close()
    proc.wait(timeout=60)
    assert line, proc.stderr.read().decode()[-2000:]
    return {"seen": json.loads(line), "users": users, "seed": seed}


def test_the_submission_never_runs_as_host_root(sandboxed):
    interpreter = [uid for name, uid in sandboxed["users"].items() if name.startswith("python")]
    expected = isolation.SANDBOX_UID if os.geteuid() == 0 else os.getuid()
    assert interpreter == [expected], sandboxed["users"]
    assert sandboxed["seen"]["uid"] == isolation.SANDBOX_UID
    assert sandboxed["seen"]["no_new_privs"] == "1" and int(sandboxed["seen"]["cap_eff"], 16) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-only file is another user's only when the grader is root")
def test_a_root_only_file_bound_inside_cannot_be_read(sandboxed):
    assert sandboxed["seen"]["secret"] == "PermissionError"
    assert sandboxed["seen"]["seed_copy"] == "public"


def test_etc_holds_only_what_python_needs(sandboxed):
    assert set(sandboxed["seen"]["etc"]) <= set(isolation.ETC_FILES)
    assert "shadow" not in sandboxed["seen"]["etc"] and "passwd" in sandboxed["seen"]["etc"]


def test_a_scratch_folder_is_bounded_and_never_reaches_the_host(sandboxed):
    assert sandboxed["seen"]["full"] == 28   # ENOSPC
    assert sandboxed["seen"]["written_mb"] <= isolation.TMPFS_MB
    assert sorted(p.name for p in sandboxed["seed"].iterdir()) == ["public", "secret"]
    assert not Path(SCRATCH).exists()


def test_a_row_says_isolated_only_with_every_layer():
    assert isolation.row_isolation(None, cgroup=True) == "isolated"
    partly = isolation.row_isolation(None, cgroup=False)
    assert partly.startswith("partly isolated") and "no cgroup" in partly
    assert isolation.row_isolation("bwrap missing", cgroup=True) == "not isolated: bwrap missing"
    rows = [{"isolation": "isolated"}, {"isolation": partly}]
    report = isolation.class_isolation(None, rows)
    assert report.startswith("partly isolated") and "1 of 2" in report
    whole = isolation.class_isolation(None, rows[:1])
    assert whole.startswith("isolated:") and "cgroup per submission" in whole
    assert (f"uid {isolation.SANDBOX_UID}" in whole) == (os.geteuid() == 0)


def test_the_probe_leaves_no_process_behind(sandboxed):
    time.sleep(0.2)
    assert not [p for p in psutil.process_iter(["cmdline"]) if PROBE[:40] in " ".join(p.info["cmdline"] or [])]
