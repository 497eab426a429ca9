"""A small DDP job for test_hosts.py: every rank trains the same model on its own
batches and prints one JSON line with its final parameters.

`--backend hysync`: the gradients go through `hysync.torch.attach` with
`--ranks-per-host` (hosts of several ranks reduce there first); `--backend gloo`: plain
DDP over gloo, the reference the HySync run must equal within quantization. With
`--slow-host H`, host H's ranks sleep `--slow-ms` before each step (a slow host, so that
partial rounds close without it).
"""

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hysync.torch

parser = argparse.ArgumentParser()
parser.add_argument("--backend", choices=["hysync", "gloo"], default="hysync")
parser.add_argument("--inventory")
parser.add_argument("--ranks-per-host", default="local")
parser.add_argument("--mode", default="sync")
parser.add_argument("--quorum", type=int)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--slow-host", type=int)
parser.add_argument("--slow-ms", type=float, default=30.0)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)))
generator = torch.Generator().manual_seed(100 + rank)  # this rank's own batches
x_all = torch.randn(256, 8, generator=generator)
y_all = x_all[:, :2] * 0.5 - x_all[:, 2:4]
opt = torch.optim.SGD(model.parameters(), lr=0.1)
host = int(os.environ.get("GROUP_RANK", "0"))
slow = args.slow_host is not None and host == args.slow_host

job = None
if args.backend == "hysync":
    job = hysync.torch.attach(model, inventory=args.inventory, mode=args.mode,
                              ranks_per_host=args.ranks_per_host, quorum=args.quorum,
                              timeout=120)
    steps = job.steps(args.steps)
else:
    steps = iter(range(args.steps))
uneven = 0
for _ in steps:
    if slow:
        time.sleep(args.slow_ms / 1000)
    idx = torch.randint(0, 256, (16,), generator=generator)
    loss = nn.functional.mse_loss(model(x_all[idx]), y_all[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if job is not None and job.worker is not None:
        uneven = job.worker.uneven_calls  # before finish() closes the worker
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
line = {"rank": rank, "host": host, "params": params}
if job is not None:
    line.update(updates=job.updates, steps=job.local_steps, uneven_calls=uneven,
                member=None if job.worker is None else job.worker.config.worker_id,
                members=None if job.worker is None else job.worker.config.members)
print(json.dumps(line), flush=True)
# Every rank done with the group before any tears it down: under load a gloo rank that
# destroyed its group while a peer was still closing its pairs died in gloo's teardown
# ("terminate called without an active exception", then SIGSEGV) after its result line.
# The count is kept in torchrun's store, not by a gloo barrier: on a busy machine a gloo
# barrier after the last step once never returned, every rank's result line printed.
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, timeout=timedelta(seconds=240))
world = dist.get_world_size()
store.add("host_job_finished", 1)
until = time.monotonic() + 240
while store.add("host_job_finished", 0) < world:
    if time.monotonic() > until:
        raise SystemExit(f"rank {rank}: the other ranks did not finish within 240 s")
    time.sleep(0.05)
dist.destroy_process_group()
