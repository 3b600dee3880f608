"""The 2-process gloo job's launcher and ranks: python -m helpers.gloo SCENARIO WORLD TIMEOUT WALL_LIMIT.

helpers.debugging.run_gloo_job starts this module in its own process, which spawns the ranks and prints
their outcomes as one JSON line. It imports torch only inside the ranks, so the launcher costs no torch
process of memory (each maps torch's libraries; a notebook's memory budget counts them all).
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import socket
import tempfile
import time
import traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scenario(name: str, rank: int) -> str:
    """What each rank does; returns a line describing success (errors propagate)."""
    import torch
    import torch.distributed as dist
    if name == "ok":
        t = torch.ones(4) * (rank + 1)
        dist.all_reduce(t)
        return f"all_reduce ok: {t.tolist()}"
    if name == "mismatched_shapes":        # rank 1 sends a different shape
        t = torch.ones(4 if rank == 0 else 5)
        dist.all_reduce(t)
        return f"all_reduce returned {t.tolist()}"
    if name == "missing_collective":       # rank 1 skips the collective: rank 0 waits until the timeout
        if rank == 0:
            t = torch.ones(4)
            dist.all_reduce(t)
            return f"all_reduce returned {t.tolist()}"
        return "skipped the all_reduce"
    raise ValueError(f"unknown scenario {name!r}; use 'ok', 'mismatched_shapes' or 'missing_collective'")


SCENARIOS = ("ok", "mismatched_shapes", "missing_collective")


def _worker(rank: int, world: int, port: int, scenario: str, timeout_s: float, stderr_path: str,
            results) -> None:
    err = open(stderr_path, "w")
    os.dup2(err.fileno(), 2)             # C++ aborts print to fd 2: keep that text for the parent
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            results.put((rank, "ok", _scenario(scenario, rank)))
            if scenario == "missing_collective" and rank == 1:
                time.sleep(timeout_s + 2)        # stay alive so rank 0's wait ends in a timeout, not a reset
        finally:
            dist.destroy_process_group()
    except Exception as exc:   # report the error text to the parent, whatever it is
        results.put((rank, type(exc).__name__, "".join(traceback.format_exception_only(exc)).strip()))


def _launch_ranks(scenario: str, world_size: int, timeout_s: float, wall_limit_s: float) -> dict:
    """Spawn the ranks in this (launcher) process and collect their outcomes."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    env = {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    with tempfile.TemporaryDirectory() as tmp:
        logs = [os.path.join(tmp, f"rank{r}.err") for r in range(world_size)]
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, scenario, timeout_s, logs[r], results))
                 for r in range(world_size)]
        os.environ.update(env)
        for p in procs:
            p.start()
        outcome: dict[str, dict] = {}
        deadline = time.monotonic() + wall_limit_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                p.join()
                outcome[f"rank {r}"] = {"status": "killed", "text": f"still running after {wall_limit_s:.0f} s"}
        while True:
            try:
                rank, status, text = results.get(timeout=0.5)
            except queue.Empty:
                break
            outcome[f"rank {rank}"] = {"status": status, "text": text}
        for r, p in enumerate(procs):
            outcome.setdefault(f"rank {r}", {"status": "no report", "text": f"exit code {p.exitcode}"})
            text = open(logs[r]).read() if os.path.exists(logs[r]) else ""
            outcome[f"rank {r}"]["stderr"] = [line for line in text.splitlines()
                                              if line.strip() and not line.startswith("USDT")]
    return dict(sorted(outcome.items()))


if __name__ == "__main__":
    import json
    import sys
    name, world, timeout, wall = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    print(json.dumps(_launch_ranks(name, world, timeout, wall)))
