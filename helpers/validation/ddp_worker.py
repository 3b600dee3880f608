"""One rank of the DDP check: python -m helpers.validation.ddp_worker RANK WORLD PORT OUT_DIR TIMEOUT_S.

Runs one forward/backward of helpers.validation.upgrade.ddp_model under DistributedDataParallel (gloo,
127.0.0.1) on this rank's shard and saves the averaged gradients to OUT_DIR/rank{RANK}.pt.
"""
import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from helpers.validation.upgrade import ddp_model, ddp_shard


def main(rank: int, world: int, port: int, out_dir: str, timeout_s: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        model = DistributedDataParallel(ddp_model())
        x, y = ddp_shard(rank, world)
        F.mse_loss(model(x), y).backward()        # DDP averages the gradients across ranks here
        torch.save([p.grad for p in model.parameters()], Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()          # both ranks are done before either tears gloo down
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p, out, t = sys.argv[1:6]
    main(int(r), int(w), int(p), out, int(t))
