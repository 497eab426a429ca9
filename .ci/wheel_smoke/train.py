"""A user's DDP script, run by the wheel smoke test under `torchrun --standalone`: a
linear model on synthetic data, its gradients averaged through HySync. Its folder has its
own worker.py, which must not shadow HySync's. Prints one JSON line per rank."""

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hysync.torch
import worker  # noqa: TID251 - the user's own module, next to this script

parser = argparse.ArgumentParser()
parser.add_argument("--inventory", required=True)
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
true_w = torch.randn(16, 1)
x = torch.randn(256, 16) + rank  # the ranks see different data
y = x @ true_w
model = DistributedDataParallel(nn.Linear(16, 1))
job = hysync.torch.attach(model, inventory=args.inventory)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
for _ in job.steps(args.steps):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()
print(json.dumps({"rank": rank, "first_loss": losses[0], "last_loss": losses[-1],
                  "updates": job.updates, "params": digest, "worker": worker.ROLE}), flush=True)
dist.barrier()
dist.destroy_process_group()
