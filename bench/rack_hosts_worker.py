"""One rank of bench/rack_hosts_bench.py, started by torchrun in a host namespace of the
emulated rack: the MLP on the 8x8 digits of the adaptive bench (hysync/topologies/
workload.py), trained with DDP
over gloo (`--backend gloo`) or through HySync (`--backend hysync`, hosts of several ranks
reduced on the host first where HYSYNC_RANKS_PER_HOST says so).

Rank 0 measures the held-out accuracy every `--eval-every` local steps and notes when it
first reaches `--target`; the ranks of host `--slow-host` (torchrun's GROUP_RANK) compute
`--slowdown` times longer. Each rank prints one JSON line at the end: its accuracy, its
steps, the seconds of its training loop, and where hosts reduce first, the host level's
timings (hysync/host_group.py HostTimings).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hysync.torch
from hysync.topologies.workload import accuracy, load_digits_split, make_model, shard


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["hysync", "gloo"], required=True)
    p.add_argument("--inventory")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compute-ms", type=float, default=20.0)
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--slow-host", type=int, default=-1)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    host = int(os.environ.get("GROUP_RANK", "0"))
    slowdown = args.slowdown if host == args.slow_host else 1.0
    data = load_digits_split()
    x, y = shard(data, rank, world)
    model = DistributedDataParallel(make_model("mlp", seed=args.seed))
    job = None
    if args.backend == "hysync":
        job = hysync.torch.attach(model, inventory=args.inventory, timeout=120)
        steps = job.steps(args.steps)
    else:
        steps = iter(range(args.steps))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1000 * args.seed + rank)
    reached: float | None = None
    local = 0
    start = time.monotonic()
    for _ in steps:
        t0 = time.monotonic()
        idx = torch.randint(0, len(x), (args.batch_size,), generator=generator)
        loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        busy = args.compute_ms / 1000.0 * slowdown - (time.monotonic() - t0)
        if busy > 0:
            time.sleep(busy)
        local += 1
        if (rank == 0 and reached is None and local % args.eval_every == 0
                and accuracy(model, data.x_test, data.y_test) >= args.target):
            reached = time.monotonic() - start
    seconds = time.monotonic() - start
    final = accuracy(model, data.x_test, data.y_test)
    line = {"rank": rank, "host": host, "accuracy": round(final, 4), "steps": local,
            "seconds": round(seconds, 3),
            "time_to_target": None if reached is None else round(reached, 3)}
    if job is not None:
        line["updates"] = round(job.updates, 3)
        if job.host is not None and job.host.layout.leader:
            line["host_timings"] = job.host.timings.to_dict()
    print(json.dumps(line), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
