"""What a rank of the torchrun benches trains (bench/rack_hosts_worker.py,
bench/two_level_worker.py): the adaptive bench's MLP on its shard of the 8x8 digits
(hysync/topologies/workload.py), a DDP replica over gloo (`--backend gloo`) or attached to
HySync (`--backend hysync`), with its optimizer and a batch sampler of its own. Each bench
keeps its own flags' defaults, its straggler and its loop (where its emulated compute
sits in the step)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hysync.torch
from hysync.topologies.workload import Dataset, accuracy, make_model, shard


def add_training_args(p: argparse.ArgumentParser, *, steps: int, lr: float,
                      compute_ms: float, target: float, eval_every: int) -> None:
    """The flags every rank takes, with the bench's defaults."""
    p.add_argument("--backend", choices=["hysync", "gloo"], required=True)
    p.add_argument("--inventory")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compute-ms", type=float, default=compute_ms)
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--target", type=float, default=target)
    p.add_argument("--eval-every", type=int, default=eval_every)
    p.add_argument("--seed", type=int, default=0)


@dataclass
class Replica:
    """This rank's model, its shard, and (`--backend hysync`) its HySync job."""

    rank: int
    data: Dataset
    model: nn.Module
    job: Any  # hysync.torch's attached job; None over gloo
    steps: Iterator[Any]  # the training loop's turns: the job's clock, else --steps
    opt: torch.optim.Optimizer
    batch_size: int
    _x: torch.Tensor
    _y: torch.Tensor
    _generator: torch.Generator
    _loss_fn: nn.Module

    @classmethod
    def start(cls, args: argparse.Namespace, data: Dataset, **attach: Any) -> Replica:
        """The replica of this rank of the process group; `attach`: hysync.torch.attach's
        arguments beyond the model and --inventory."""
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = shard(data, rank, world)
        model = DistributedDataParallel(make_model("mlp", seed=args.seed))
        job = None
        if args.backend == "hysync":
            job = hysync.torch.attach(model, inventory=args.inventory, **attach)
            steps = job.steps(args.steps)
        else:
            steps = iter(range(args.steps))
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        generator = torch.Generator().manual_seed(1000 * args.seed + rank)
        return cls(rank, data, model, job, steps, opt, args.batch_size, x, y, generator,
                   nn.CrossEntropyLoss())

    def loss(self) -> torch.Tensor:
        """The loss of a batch drawn from the shard (the step's forward pass)."""
        idx = torch.randint(0, len(self._x), (self.batch_size,), generator=self._generator)
        return self._loss_fn(self.model(self._x[idx]), self._y[idx])

    def update(self, loss: torch.Tensor) -> None:
        """Backward (DDP's all-reduce) and the optimizer's step."""
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def accuracy(self) -> float:
        """The replica's accuracy on the held-out digits."""
        return accuracy(self.model, self.data.x_test, self.data.y_test)
