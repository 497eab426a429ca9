"""The training workloads: the models a scenario can name, on the digits."""

from __future__ import annotations

import torch

from hysync.topologies.scenario import MODELS
from hysync.topologies.workload import load_digits_split, make_model
from hysync.wire import LANES


def test_every_scenario_model_classifies_the_digits():
    data = load_digits_split()
    for kind in MODELS:
        out = make_model(kind)(data.x_test[:5])
        assert out.shape == (5, 10), kind


def test_cnn_is_a_model_whose_communication_matters():
    params = sum(p.numel() for p in make_model("cnn").parameters())
    assert 100_000 <= params <= 1_000_000
    assert -(-params // LANES) > 30 * -(-sum(p.numel() for p in make_model("mlp").parameters())
                                        // LANES)  # packets per step: 1,847 against 57


def test_the_same_seed_gives_the_same_initial_model():
    a, b = make_model("cnn", seed=3), make_model("cnn", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
