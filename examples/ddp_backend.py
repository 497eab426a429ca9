"""DDP with no hook: the `hysync` process-group backend carries its gradient all-reduces.

    HYSYNC_INVENTORY=examples/loopback.toml \\
        torchrun --standalone --nproc-per-node 2 examples/ddp_backend.py

The same MLP on the same handwritten digits as examples/train_ddp.py, written as an
ordinary DDP script: the backend's name in `init_process_group` is the only HySync line
(`--backend gloo` runs the same script without HySync, to compare). The job is admitted
when the group is created (the inventory from HYSYNC_INVENTORY, or `--inventory`) and
released by `destroy_process_group`. Prints one JSON line per rank with its held-out
accuracy.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from train_ddp import load_data  # the same data as the hook's example, beside this script

import hysync.backend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="hysync", help="hysync (default), or gloo to compare")
    p.add_argument("--inventory", help="the testbed's inventory (default: $HYSYNC_INVENTORY)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    options = hysync.backend.Options(inventory=args.inventory) \
        if args.backend == "hysync" else None
    dist.init_process_group(args.backend, pg_options=options)
    rank, world = dist.get_rank(), dist.get_world_size()
    data, x_train, y_train, x_test, y_test = load_data()
    x, y = x_train[rank::world], y_train[rank::world]  # this rank's shard
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(),
                                                  nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    start = time.monotonic()
    for _ in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=generator)
        loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients through the process group
        opt.step()
    with torch.no_grad():
        predicted = model(x_test).argmax(dim=1)
    accuracy = float((predicted == y_test).float().mean())
    print(json.dumps({"rank": rank, "backend": args.backend, "data": data, "steps": args.steps,
                      "accuracy": round(accuracy, 4),
                      "seconds": round(time.monotonic() - start, 2)}), flush=True)
    # every rank done with the group before any tears it down: a gloo rank that destroys
    # its group while a peer still closes its pairs can hang or die in gloo's teardown
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
