"""A training script that ends the way jobs end under torchrun, for test_exit.py:

* `--end return`: the script returns after some steps without finishing or closing its
  HySync job; rank 0 returns 3 s after rank 1, its model averager inside a round that
  rank 1 will never join;
* `--end crash`: rank 1 raises mid-training; torchrun then SIGTERMs rank 0, which is
  waiting in backward for a round rank 1 will never send.

Each rank prints when its script ends and when the interpreter runs its exit hooks,
which is after threading has joined every non-daemon thread: the gap is the time the
exit waited on threads.
"""

import argparse
import atexit
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hysync.torch

parser = argparse.ArgumentParser()
parser.add_argument("--inventory", required=True)
parser.add_argument("--end", choices=["return", "crash"], required=True)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
atexit.register(lambda: print(f"rank {rank} exits at {time.monotonic():.3f}", flush=True))
torch.manual_seed(0)
x, y = torch.randn(64, 8), torch.randn(64, 1)
model = DistributedDataParallel(nn.Linear(8, 1))
job = hysync.torch.attach(model, inventory=args.inventory, average_every=0.02, timeout=120)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in job.steps(10**6):
    if step == 20 and (args.end == "return" or rank == 1):
        if rank == 0:  # rank 1 is gone by then: rank 0's averaging round waits for it
            time.sleep(3)
        print(f"rank {rank} ends at {time.monotonic():.3f}", flush=True)
        if args.end == "crash":
            raise RuntimeError("rank 1 fails on purpose")
        sys.exit(0)  # as a script's end: no finish, no close
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
