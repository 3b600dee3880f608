"""Process trees: their members, their memory, and stopping them. Shared by the batch runner, the grader
and the lessons (helpers.data measures a loader's workers with it)."""
from __future__ import annotations

import psutil


def process_tree(proc: psutil.Process) -> list[psutil.Process]:
    """Every living descendant of `proc` (not proc itself); [] when it has ended."""
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def memory_mb(procs: list[psutil.Process]) -> float:
    """Memory of a process tree: the sum of proportional set sizes (shared pages, such as torch's
    libraries mapped by every process, counted once across the tree), or of RSS where PSS is unknown."""
    total = 0
    for p in procs:
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.AccessDenied:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        except psutil.Error:
            pass
    return total / 2**20


def kill(procs: list[psutil.Process]) -> None:
    """SIGKILL each process; those already gone are skipped."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
