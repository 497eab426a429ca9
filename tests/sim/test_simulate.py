"""A fixed budget of seeds of the deterministic simulation (docs/protocol.md §10) in CI.

Every seed draws its own job and faults (plan.py); a failure names the seed and the
command that replays it. `make simulate` runs many more.
"""

from __future__ import annotations

import pytest

from .check import check
from .plan import FAULT_KINDS, Plan, draw
from .run import simulate

# About 1.5 minutes on a loaded 2-core machine: CI_SEEDS seeds on each target, the fault
# kinds drawn freely (tests/sim/plan.py), plus a few seeds per kind on its own.
CI_SEEDS = 100
PER_KIND = 5


def _run(plan: Plan, target: str) -> None:
    rec, sim = simulate(plan, target)
    found = check(rec, sim)
    assert not found, (f"seed {plan.seed} on {target}: {found[0]}\n  reproduce: make simulate "
                       f"SEED={plan.seed} TARGETS={target}")


@pytest.mark.parametrize("target", ["native", "python"])
def test_seeds(target: str) -> None:
    for seed in range(CI_SEEDS):
        _run(draw(seed), target)


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind(kind: str) -> None:
    for seed in range(PER_KIND):
        _run(draw(10_000 + seed, (kind,)), "native")


def test_replay_is_exact() -> None:
    """A seed is a complete run: twice the same packets, swaps and simulated time."""
    plan = draw(7)
    a, _ = simulate(plan, "native")
    b, _ = simulate(plan, "native")
    assert (a.packets, a.swaps, a.sim_seconds, a.counted.keys()) == \
        (b.packets, b.swaps, b.sim_seconds, b.counted.keys())
    assert Plan.from_json(plan.to_json()) == plan
