"""The two-level protocol's model (docs/protocol.md §11): its seeds hold every invariant, and
each rule, taken out, breaks one."""

from __future__ import annotations

import pytest

from tests.sim.two_level_model import MUTATIONS, Run, main

SEEDS = 1000


def test_seeds_hold_every_invariant():
    failing = {seed: problems for seed in range(SEEDS) if (problems := Run(seed).run())}
    assert not failing, f"{len(failing)} of {SEEDS} fail, first: {next(iter(failing.items()))}"


# The invariant each rule protects, and the seed where the search for a run that breaks it
# without the rule starts (a sweep's first failure: some need a rare schedule).
EXPECTED = {
    "refuse": ("exactly-once", 0),
    "hold": ("exactly-once", 0),
    "keep_last": ("exactly-once", 0),
    "verdict": ("exactly-once", 0),
    "weight": ("divisor", 0),
    "late_mark": ("exactly-once", 10_000),
    "backward": ("not live", 48_000),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_rule_is_needed(mutation):
    """Without the rule some seed breaks the invariant it protects, and the same seed holds
    with the rule in place."""
    invariant, start = EXPECTED[mutation]
    for seed in range(start, start + 3000):
        problems = Run(seed, mutations=frozenset([mutation])).run(budget=20_000)
        if problems:
            break
    else:
        pytest.fail(f"no seed of {start}..{start + 2999} breaks an invariant without "
                    f"'{mutation}' ({MUTATIONS[mutation]})")
    assert any(p.startswith(invariant) for p in problems), problems
    assert Run(seed).run() == []


def test_a_seed_replays(capsys):
    assert main(["--seed", "7"]) == 0
    assert "seed 7: no violation" in capsys.readouterr().out
