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

from bench.digits_rank import Replica, add_training_args
from hysync.topologies.workload import load_digits_split


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_args(p, steps=200, lr=0.05, compute_ms=20.0, target=0.9, eval_every=10)
    p.add_argument("--slow-host", type=int, default=-1)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    host = int(os.environ.get("GROUP_RANK", "0"))
    slowdown = args.slowdown if host == args.slow_host else 1.0
    me = Replica.start(args, load_digits_split(), timeout=120)
    job = me.job
    reached: float | None = None
    local = 0
    start = time.monotonic()
    for _ in me.steps:
        t0 = time.monotonic()
        me.update(me.loss())
        busy = args.compute_ms / 1000.0 * slowdown - (time.monotonic() - t0)
        if busy > 0:
            time.sleep(busy)
        local += 1
        if (me.rank == 0 and reached is None and local % args.eval_every == 0
                and me.accuracy() >= args.target):
            reached = time.monotonic() - start
    seconds = time.monotonic() - start
    line = {"rank": me.rank, "host": host, "accuracy": round(me.accuracy(), 4), "steps": local,
            "seconds": round(seconds, 3),
            "time_to_target": None if reached is None else round(reached, 3)}
    if job is not None:
        line["updates"] = round(job.updates, 3)
        if job.host is not None and job.host.layout.leader:
            line["host_timings"] = job.host.timings.to_dict()
    print(json.dumps(line), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
