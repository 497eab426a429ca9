"""examples/train_ddp.py's data on a base install (no scikit-learn): synthetic digits
that every rank draws alike and that a model must actually learn to classify."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest
import torch
from torch import nn

from .conftest import ROOT


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn...` raises ImportError
    spec = importlib.util.spec_from_file_location("train_ddp", ROOT / "examples" / "train_ddp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_scikit_learn_the_example_trains_on_synthetic_digits(example: ModuleType) -> None:
    name, x_train, y_train, x_test, y_test = example.load_data()
    assert name == "synthetic"
    assert (x_train.shape, x_test.shape) == ((1347, 64), (450, 64))  # the digits' split
    assert x_train.dtype == torch.float32 and x_train.min() >= 0 and x_train.max() <= 1
    assert set(y_train.tolist()) == set(range(10))
    again = example.load_data()  # every rank computes it: it must be the same set
    assert torch.equal(again[1], x_train) and torch.equal(again[4], y_test)

    # What the example trains, on one process: it learns (chance is 0.1), and the classes
    # overlap enough that it does not score perfectly - the accuracy still tells.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        idx = torch.randint(0, len(x_train), (64,), generator=g)
        loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(dim=1) == y_test).float().mean())
    assert 0.9 <= accuracy < 0.995


def test_whole_updates_count_a_partial_round_as_part_of_one(example: ModuleType) -> None:
    assert example.whole(200.5) == 200  # the job's clock stopped between two updates
    assert example.whole(199.99999999999) == 200  # the clock's float rounding
    assert isinstance(example.whole(3.0), int)
