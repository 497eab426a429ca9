"""The training workload of emulation runs and the demo: a real model on real data.

Data: scikit-learn's handwritten digits (1,797 8x8 images, 10 classes), shipped
inside the scikit-learn package, so nothing is downloaded at run time. A fixed
seed splits it into a held-out test set and one shard per worker.

Models (the scenario's `model`):
* `mlp`: 64-48-10, 3,610 parameters = 57 packets of 64 lanes per step. Its real compute
  is a millisecond: the scenario's `compute_ms` is emulated on top of it, so that, as
  in real training, compute and not the tiny model's communication sets the pace.
* `cnn`: two 3x3 convolutions (32, 64 channels), 2x2 max-pooling, 1024-96-10: 118,186
  parameters = 1,847 packets per step, 6 ms of real compute; communication matters.
  On the digits rather than MNIST-1D (the `mnist1d` package generates it locally):
  the digits take a CNN to 95% in about a hundred steps, MNIST-1D to 90% in about a
  thousand, which would not fit a demo of a few minutes on 2 cores.
The emulated compute (times the straggler's slowdown) is added to either.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hysync.topologies.scenario import MODELS

TEST_FRACTION = 0.2


@dataclass(frozen=True)
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits_split(seed: int = 0) -> Dataset:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return Dataset(torch.from_numpy(x[train]), torch.from_numpy(y[train]),
                   torch.from_numpy(x[test]), torch.from_numpy(y[test]))


def shard(data: Dataset, worker: int, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker `worker`'s disjoint share of the training set."""
    return data.x_train[worker::workers], data.y_train[worker::workers]


def make_model(kind: str = "mlp", seed: int = 0) -> nn.Module:
    """A model of scenario.MODELS for the digits' 64 pixels, initialized from `seed`."""
    torch.manual_seed(seed)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
    if kind == "cnn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 4 * 4, 96), nn.ReLU(), nn.Linear(96, 10))
    raise ValueError(f"unknown model {kind!r}: one of {', '.join(MODELS)}")


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(dim=1) == y).float().mean())


@dataclass
class StepRecord:
    step: int
    t: float  # seconds since the run started
    progress: float  # the job's updates applied so far, in sync rounds (ends the run)
    step_s: float
    loss: float
    wait_s: float = 0.0  # of step_s: blocked until the switch answered (HySync)
    comm_s: float = 0.0  # of step_s: the rest of the all-reduce (compute: what is left)
    mode: str | None = None
    contributors: float | None = None  # mean contributors per round in this step
    accuracy: float | None = None


@dataclass
class RunLog:
    config: str
    worker: int
    workers: int
    steps: list[StepRecord] = field(default_factory=list)
    final_accuracy: float | None = None
    ended: str = "completed"
    extra: dict = field(default_factory=dict)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)) + "\n")


@dataclass
class TrainConfig:
    steps: int
    compute_ms: float = 20.0
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    eval_every: int = 10
    seed: int = 0


def train(model: nn.Module, data: Dataset, worker: int, workers: int, cfg: TrainConfig,
          log: RunLog, slowdown: Callable[[float], float] = lambda t: 1.0,
          dead: Callable[[float], bool] = lambda t: False,
          step_info: Callable[[], tuple[str | None, float | None, float]] = (
              lambda: (None, None, 1.0)),
          on_step: Callable[[int, float], float] = lambda step, progress: progress,
          progress: Callable[[StepRecord], None] = lambda rec: None,
          split: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0),
          step_lock: AbstractContextManager | None = None) -> RunLog:
    """SGD on this worker's shard; the model's gradient averaging happens in backward()
    (DDP with gloo, or DDP with the HySync communication hook).

    The run ends when the *job* has applied `cfg.steps` updates (step_info's third
    value, summed), not after this worker's own iterations: a straggler in partial or
    async mode applies several rounds in one call, and every replica must stop at the
    same round or the last ones would wait for members that have left.

    `on_step(step, progress)` runs before each step, between optimizer steps (model
    averaging applies its rounds there) and returns the job clock to go on from;
    `step_lock` is held while the optimizer writes the parameters (model averaging
    snapshots them under it); `split()` gives the step's (waiting, communication)
    seconds, see topologies/step_split.py."""
    x, y = shard(data, worker, workers)
    rng = np.random.default_rng(cfg.seed * 1000 + worker)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    applied_total = 0.0
    for step in range(4 * cfg.steps):  # a bound, in case a mode applies little per call
        if applied_total >= cfg.steps - 1e-9:
            break
        applied_total = on_step(step, applied_total)
        if applied_total >= cfg.steps - 1e-9:
            break
        t0 = time.perf_counter()
        if dead(t0 - start):
            log.ended = f"died at step {step} (scenario)"
            break
        idx = torch.from_numpy(rng.integers(0, len(x), cfg.batch_size))
        loss = loss_fn(model(x[idx]), y[idx])
        # Emulated compute of a larger model, slowed down while this worker straggles.
        emulate = cfg.compute_ms / 1000.0 * slowdown(t0 - start) - (time.perf_counter() - t0)
        if emulate > 0:
            time.sleep(emulate)
        loss.backward()
        with step_lock or nullcontext():
            opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        mode, contributors, applied = step_info()
        applied_total += applied
        wait_s, comm_s = split()
        rec = StepRecord(step, now - start, round(applied_total, 3), now - t0,
                         float(loss.detach()), wait_s, comm_s, mode, contributors)
        if step % cfg.eval_every == 0 or applied_total >= cfg.steps - 1e-9:
            rec.accuracy = accuracy(model, data.x_test, data.y_test)
        log.steps.append(rec)
        progress(rec)
    if log.ended == "completed" and applied_total < cfg.steps - 1e-9:
        # A replica that applied little per call (a fast one in partial mode behind a slow
        # switch) stops at the bound, ahead of the job: its model is not the job's.
        log.extra["stopped_at_step_bound"] = round(applied_total, 3)
    log.final_accuracy = accuracy(model, data.x_test, data.y_test)
    return log
