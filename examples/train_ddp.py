"""Data-parallel training of an MLP on handwritten digits, through HySync.

Run the same command on every host of the testbed (one process per host):

    GLOO_SOCKET_IFNAME=eth1 torchrun --nnodes 4 --nproc-per-node 1 --node-rank R \\
        --master-addr 10.0.0.1 --master-port 29500 \\
        examples/train_ddp.py --inventory testbed.toml

or on one machine, against the softswitch (README, quick start):

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py \\
        --inventory examples/loopback.toml

or through leaves and a spine, on a job the operator installed from a job file (each rank
one member of the file, behind its leaf; docs/testbed.md, "Training through leaves and a
spine"):

    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py \\
        --inventory fabric.toml --job job.toml

It is an ordinary DDP script: the three lines marked `# HySync` are all it takes.
`torchrun` sets up the process group (gloo: DDP broadcasts the initial parameters with
it, and HySync publishes the workers' addresses through its store); the gradients are
averaged in the switch. Prints one JSON line per rank at the end with its held-out
accuracy. `--compute-ms` and `--slowdown` emulate a larger model and a slow host.

The data are scikit-learn's 8x8 digits where scikit-learn is installed (HySync's
`emulation` extra); a base install trains on synthetic digits of the same shape instead
(noisy copies of ten random 8x8 templates, as hard as the real ones: about 0.95 held out).
The JSON lines say which (`"data"`).
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

import hysync.torch  # HySync


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inventory", required=True, help="the testbed's inventory (TOML)")
    p.add_argument("--job", metavar="FILE",
                   help="join the job installed from this job file (no serve): rank r is "
                   "its r-th member, or the one HYSYNC_MEMBER names (LEAF:WORKER)")
    p.add_argument("--steps", type=int, default=300, help="updates the job applies")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compute-ms", type=float, default=0.0,
                   help="extra compute time per step (emulates a larger model)")
    p.add_argument("--slowdown", type=float, default=1.0,
                   help="this host computes FACTOR times slower (a straggler)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the model trains (cuda: the GPU of LOCAL_RANK)")
    p.add_argument("--average-every", type=float, metavar="SECONDS",
                   help="also average the replicas' parameters through the switch every "
                   "SECONDS (keeps them together in partial and async modes)")
    return p.parse_args()


def load_data() -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(name, x_train, y_train, x_test, y_test): 64 features in [0, 1], 10 classes, the
    same split on every rank."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        # Every rank draws the same set from a fixed seed; the noise makes the classes
        # overlap, so the accuracy still shows whether training worked.
        g = torch.Generator().manual_seed(0)
        templates = torch.rand(10, 64, generator=g)
        y = torch.randperm(1797, generator=g) % 10
        x = (templates[y] + 0.55 * torch.randn(1797, 64, generator=g)).clamp(0, 1)
        return "synthetic", x[:1347], y[:1347], x[1347:], y[1347:]
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.25, random_state=0)
    return ("digits", torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train),
            torch.tensor(x_test, dtype=torch.float32), torch.tensor(y_test))


def whole(updates: float) -> int:
    """The job's clock in whole updates: it counts a round that q of n members made as q/n
    of one, so it can stop between two integers (1e-9: the clock's own rounding)."""
    return int(updates + 1e-9)


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    data, x_train, y_train, x_test, y_test = load_data()
    x = x_train[rank::world].to(device)  # this shard
    y = y_train[rank::world].to(device)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(),
                                                  nn.Linear(64, 10)).to(device))
    job = hysync.torch.attach(model, inventory=args.inventory,  # HySync
                              average_every=args.average_every, job_file=args.job)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    start = time.monotonic()
    for _ in job.steps(args.steps):  # HySync: until the job has applied --steps updates
        t0 = time.monotonic()
        idx = torch.randint(0, len(x), (args.batch_size,), generator=generator).to(device)
        loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        busy = args.compute_ms / 1000.0 * args.slowdown - (time.monotonic() - t0)
        if busy > 0:
            time.sleep(busy)
        if rank == 0 and job.local_steps % 50 == 49:
            print(json.dumps({"progress": whole(job.updates), "loss": round(loss.item(), 4),
                              "seconds": round(time.monotonic() - start, 1)}), flush=True)
    with torch.no_grad():
        predicted = model(x_test.to(device)).argmax(dim=1)
    accuracy = float((predicted.cpu() == y_test).float().mean())
    print(json.dumps({"rank": rank, "data": data, "steps": job.local_steps,
                      "updates": whole(job.updates),
                      "accuracy": round(accuracy, 4), "seconds": round(time.monotonic() - start,
                                                                       2)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
