"""A step's all-reduce time, split into waiting for the switch and communication."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from hysync.topologies.step_split import StepSplit

REDUCE_S = 0.1


@dataclass
class Bucket:
    """What the wrapper reads of a DDP GradBucket: its index."""

    i: int

    def index(self) -> int:
        return self.i


def slow_hook(state: object, bucket: Bucket) -> torch.futures.Future:
    """An all-reduce whose result comes back REDUCE_S later, on another thread (as the
    transport's)."""
    fut: torch.futures.Future = torch.futures.Future()
    threading.Timer(REDUCE_S, lambda: fut.set_result(torch.ones(3))).start()
    return fut


def test_waiting_and_communication_add_up_to_the_allreduce_of_the_step():
    split = StepSplit(waited=lambda index: 0.03)
    hook = split.wrap(slow_hook)
    first, second = hook(None, Bucket(0)), hook(None, Bucket(1))  # two buckets overlap
    assert torch.equal(first.wait(), torch.ones(3)) and torch.equal(second.wait(), torch.ones(3))
    waiting, communication = split.take()
    assert waiting == pytest.approx(0.06)  # both buckets' waiting
    # one interval from the first call to the last result, not the sum of the two
    assert REDUCE_S * 0.9 <= waiting + communication < 2 * REDUCE_S
    assert split.take() == (0.0, 0.0)  # the next step starts from nothing


def test_without_a_waiting_measure_all_of_it_is_communication():
    split = StepSplit()  # gloo
    split.wrap(slow_hook)(None, Bucket(0)).wait()
    waiting, communication = split.take()
    assert waiting == 0.0 and communication >= REDUCE_S * 0.9
