"""examples/train_ddp.py's model and data for test_fabric_training.py, joined to a job
installed across leaves and a spine (`hysync.torch.attach(..., job_file=...)`), or with
`--hosts-per-leaf N` instead of `--job` admitted by a serve across them (rank r on host
h{r // N}-{r % N} of the inventory, test_serve_fabric.py). With `--pause-at`, when the
job's clock reaches it every rank prints its parameters' digest and waits for
`--resume-file` to appear (the test swaps a level's mode meanwhile), then trains on to
`--steps`. With `--average-every S` the serve admits the job's model-averaging job too;
`--perturb X` then moves rank r's parameters by r * X after DDP made them one model (the
replicas start apart, each printing its digest), so that only averaging makes them one
again. At the end each rank prints its held-out accuracy, its parameters' digest and
how many results it applied in each mode (and where it averaged, and its rounds).
"""

import argparse
import hashlib
import importlib.util
import json
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hysync.torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"

parser = argparse.ArgumentParser()
parser.add_argument("--inventory", required=True)
job_or_serve = parser.add_mutually_exclusive_group(required=True)
job_or_serve.add_argument("--job")
job_or_serve.add_argument("--hosts-per-leaf", type=int)
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--pause-at", type=int, default=10**9)  # default: never
parser.add_argument("--resume-file", default="")
parser.add_argument("--average-every", type=float, default=None)  # seconds; with the serve
parser.add_argument("--perturb", type=float, default=0.0)
args = parser.parse_args()

spec = importlib.util.spec_from_file_location("train_ddp", EXAMPLE)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data, x_train, y_train, x_test, y_test = example.load_data()
x, y = x_train[rank::world], y_train[rank::world]
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
if args.job:
    job = hysync.torch.attach(model, inventory=args.inventory, job_file=args.job, timeout=60)
else:
    n = args.hosts_per_leaf
    job = hysync.torch.attach(model, inventory=args.inventory, host=f"h{rank // n}-{rank % n}",
                              average_every=args.average_every, timeout=60)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
generator = torch.Generator().manual_seed(rank)


def params() -> str:
    """A digest of this replica's parameters (short: the ranks' lines share one pipe)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


if args.perturb:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank * args.perturb)
    print(json.dumps({"rank": rank, "start_params": params()}), flush=True)

modes: Counter = Counter()
paused = False
for _ in job.steps(args.steps):
    if not paused and job.updates >= args.pause_at - 1e-9:
        paused = True
        print(json.dumps({"rank": rank, "paused_at": example.whole(job.updates),
                          "params": params()}), flush=True)
        while not Path(args.resume_file).exists():
            time.sleep(0.05)
    idx = torch.randint(0, len(x), (32,), generator=generator)
    loss = loss_fn(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    stats = job.state.last_stats()
    if stats is not None:
        modes.update(stats.modes)
member = job.worker.config
with torch.no_grad():
    accuracy = float((model(x_test).argmax(dim=1) == y_test).float().mean())
record = {"rank": rank, "data": data, "worker_id": member.worker_id,
          "switch": member.switch_host, "behind_leaf": member.behind_leaf,
          "updates": example.whole(job.updates), "steps": job.local_steps,
          "modes": dict(modes), "accuracy": accuracy, "params": params()}
if job.averager is not None:
    avg, rounds = job.averager.worker.config, job.averager.history
    full = [r for r in rounds if r["full"]]  # the rounds that averaged the parameters
    record["averaging"] = {"job_id": avg.job_id, "worker_id": avg.worker_id,
                           "switch": avg.switch_host, "behind_leaf": avg.behind_leaf,
                           "rounds": len(rounds), "full_rounds": len(full),
                           "largest_move": max((r["max_move"] for r in full), default=0.0),
                           "final": bool(rounds and rounds[-1]["final"])}
print(json.dumps(record), flush=True)
dist.barrier()
dist.destroy_process_group()
