"""Real worker engines behind real leaves and a spine (tests/sim/two_level_engines.py): seeds
that hold every invariant on both pipelines, a seed that replays, and the checker finding the
runs that break without the host's rules of docs/protocol.md §11 ("What a host does")."""

from __future__ import annotations

import pytest

from tests.sim.two_level_engines import simulate

# Seeds whose runs relay spine verdicts (RESYNCs with flag RELAYED) to hosts, after a spine
# CHUNK_MISMATCH, with mode swaps at either level.
RELAYING = (1, 22, 33, 43)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", RELAYING)
def test_engines_behind_leaves_hold_every_invariant(seed: int, target: str) -> None:
    problems, stats = simulate(seed, target)
    assert problems == []
    assert stats["relayed_resyncs"] > 0 and stats["host_relayed"] > 0
    assert stats["spine_results"] > 0 and stats["results_applied"] > 0


def test_a_seed_replays_exactly() -> None:
    first = simulate(43)
    assert first == simulate(43)


def test_without_the_relayed_rule_hosts_stall() -> None:
    """A host that takes a relayed verdict for another member's reply keeps waiting on a
    sum the spine refused; with the spine's round waiting on its rack, calls fail."""
    problems, _ = simulate(43, faults={"ignore_relayed": True})
    assert any(p.startswith("failure:") for p in problems), problems


def test_without_behind_leaf_a_leafs_refusal_reads_as_a_restart() -> None:
    """The leaf keeps no result of the round it closed while its sum is at the spine: its
    STALE answer for that round is taken for a new switch state, and the call aborts."""
    problems, _ = simulate(1, engine={"behind_leaf": False})
    assert any("ended 'reset'" in p for p in problems), problems
