"""One rank of bench/two_level_bench.py, started by torchrun: the adaptive bench's MLP on the
8x8 digits (hysync/topologies/workload.py), trained with DDP over gloo (`--backend gloo`) or
through a HySync job installed across two leaves and a spine (`--backend hysync`: the job
file's member of this rank, `hysync.torch.attach(job_file=...)`).

Rank r sits in rack r // `--hosts-per-rack` (the job file's members by leaf); every rank of
rack `--slow-rack` computes `--slowdown` times longer (the emulated compute of the
one-switch benches, times the straggler's factor). Each rank measures its replica's held-out
accuracy every `--eval-every` local steps and prints a `reached` line the first time it is
at `--target` or above (seconds since the ranks started together), a `trained` line when the
job's clock reached `--steps` (before the rank leaves the job), then one line at the end:
its accuracy, local steps, the job's updates, the seconds of its training loop and how many
results it applied in each mode.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch
import torch.distributed as dist

from bench.digits_rank import Replica, add_training_args
from hysync.topologies.workload import load_digits_split


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_args(p, steps=300, lr=0.03, compute_ms=50.0, target=0.93, eval_every=5)
    p.add_argument("--job")
    p.add_argument("--slow-rack", type=int, default=-1)
    p.add_argument("--hosts-per-rack", type=int, default=3)
    p.add_argument("--dead-after", type=float, default=30.0,
                   help="seconds a HySync round waits for a member before giving up")
    return p.parse_args()


def say(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # six ranks and three switches share the machine's cores
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rack = rank // args.hosts_per_rack
    slowdown = args.slowdown if rack == args.slow_rack else 1.0
    me = Replica.start(args, load_digits_split(args.seed), job_file=args.job,
                       timeout=args.dead_after)
    job = me.job
    modes: Counter = Counter()
    reached: float | None = None
    trained = False
    local = 0
    dist.barrier()  # every rank attached: the clocks start together
    start = time.monotonic()
    for _ in me.steps:
        t0 = time.monotonic()
        loss = me.loss()
        busy = args.compute_ms / 1000.0 * slowdown - (time.monotonic() - t0)
        if busy > 0:
            time.sleep(busy)
        me.update(loss)
        local += 1
        if job is not None and (stats := job.state.last_stats()) is not None:
            modes.update(stats.modes)
        # job.updates counts this step's call when the loop turns; the call itself says now
        if (job is not None and not trained
                and job.updates + job.state.updates_applied() >= args.steps - 1e-9):
            # the job's last update is applied: the next turn of the loop leaves the job
            trained = True
            say({"rank": rank, "trained": local})
        if (reached is None and local % args.eval_every == 0
                and me.accuracy() >= args.target):
            reached = time.monotonic() - start
            say({"rank": rank, "rack": rack, "reached": round(reached, 3), "steps": local,
                 "updates": round(job.updates, 3) if job is not None else local})
    seconds = time.monotonic() - start
    say({"rank": rank, "rack": rack, "accuracy": round(me.accuracy(), 4),
         "steps": local, "updates": round(job.updates, 3) if job is not None else local,
         "seconds": round(seconds, 3), "time_to_target": reached, "modes": dict(modes)})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
