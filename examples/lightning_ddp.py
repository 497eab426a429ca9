"""PyTorch Lightning's DDPStrategy over the `hysync` process-group backend.

    HYSYNC_INVENTORY=examples/loopback.toml HYSYNC_EXACT_OPS=gloo \\
        torchrun --standalone --nproc-per-node 2 examples/lightning_ddp.py

Lightning builds the process group and DDP itself; naming the backend in
`DDPStrategy(process_group_backend="hysync")` is the only HySync line, and the inventory
comes from HYSYNC_INVENTORY. Lightning's ModelCheckpoint and EarlyStopping all-reduce
integer flags between ranks (whether to save, whether to stop), which a fixed-point sum
cannot carry exactly: HYSYNC_EXACT_OPS=gloo (set here unless the environment says
otherwise) sends those to gloo. Needs `pip install pytorch-lightning`. Prints one JSON
line per rank with its held-out accuracy.
"""

from __future__ import annotations

import argparse
import json
import os

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from train_ddp import load_data  # the same data as the hook's example, beside this script

import hysync.backend  # noqa: F401 - registers the "hysync" backend


class Digits(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    os.environ.setdefault(hysync.backend.EXACT_OPS_ENV, "gloo")
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    data, x_train, y_train, x_test, y_test = load_data()
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get(
        "LOCAL_WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=nodes, strategy=DDPStrategy(process_group_backend="hysync"),
        max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False)
    model = Digits(args.lr)
    # Lightning gives each rank its shard (a DistributedSampler)
    trainer.fit(model, DataLoader(TensorDataset(x_train, y_train),
                                  batch_size=args.batch_size, shuffle=True))
    with torch.no_grad():
        predicted = model(x_test).argmax(dim=1)
    accuracy = float((predicted == y_test).float().mean())
    print(json.dumps({"rank": trainer.global_rank, "data": data,
                      "backend": torch.distributed.get_backend(),
                      "steps": trainer.global_step, "accuracy": round(accuracy, 4)}),
          flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
