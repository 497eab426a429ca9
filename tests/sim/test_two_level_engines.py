"""Real worker engines behind real leaves and a spine (tests/sim/two_level_engines.py): seeds
that hold every invariant on both pipelines, a seed that replays, fair races that leave no
rack out, and the checker finding the runs that break without the leaf's step back or the
host's rules of docs/protocol.md §11."""

from __future__ import annotations

import pytest

from hysync import wire
from hysync.softswitch.pipeline import Pipeline
from tests.sim.two_level_engines import fairness, simulate

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
    problems, _ = simulate(29, faults={"ignore_relayed": True})
    assert any(p.startswith("failure:") for p in problems), problems
    assert simulate(29)[0] == []


def test_without_behind_leaf_a_leafs_refusal_reads_as_a_restart() -> None:
    """The leaf keeps no result of the round it closed while its sum is at the spine: its
    STALE answer for that round is taken for a new switch state, and the call aborts."""
    problems, _ = simulate(1, engine={"behind_leaf": False})
    assert any("ended 'reset'" in p for p in problems), problems


# Seeds where the spine answers a leaf's sum CHUNK_MISMATCH while the spine's round waits on
# that rack: the leaf must take the round back open (§11, the leaf, step 5).
STEP_BACK = (0, 1, 2, 5, 11)
# A seed where a host that learned the round after the one its leaf took back open is told
# STALE_ROUND for that round.
STEP_BACK_HOST = 13


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", STEP_BACK)
def test_a_leaf_takes_its_round_back_open_for_the_spines_chunk(seed: int, target: str) -> None:
    problems, stats = simulate(seed, target)
    assert problems == []
    assert stats["spine_chunk_mismatch"] > 0 and stats["leaves_past_spine"] == 0


def _without_the_leafs_step_back(self, s, *args):
    """Pipeline._spine_resync with the step back undone: the round, what it held open and its
    hosts' cells as they were before the verdict (the sum's own hosts stay marked refused)."""
    base = s * wire.MAX_WORKERS
    before = (self.round[s], self.count[s], self.bitmap[s], self.res_valid[s])
    cells = (self.member_seq[base:base + wire.MAX_WORKERS],
             self.member_epoch[base:base + wire.MAX_WORKERS])
    out = _spine_resync(self, s, *args)
    if self.round[s] == (before[0] - 1) & 0xFFFFFFFF:
        self.round[s], self.count[s], self.bitmap[s], self.res_valid[s] = before
        held = before[2]
        for w in range(wire.MAX_WORKERS):
            if held >> w & 1:
                self.member_seq[base + w] = cells[0][w]
                self.member_epoch[base + w] = cells[1][w]
    return out


_spine_resync = Pipeline._spine_resync


def test_without_the_leafs_step_back_the_spine_round_stalls(monkeypatch) -> None:
    """A leaf that stays a round ahead of the spine after a CHUNK_MISMATCH sends its next sum
    for a round the spine has not reached: the spine's round waits on the rack for ever."""
    monkeypatch.setattr(Pipeline, "_spine_resync", _without_the_leafs_step_back)
    problems, stats = simulate(0, "python")
    assert stats["leaves_past_spine"] > 0
    assert any(p.startswith("failure:") and "a leaf moved past a spine round" in p
               for p in problems), problems


def test_without_the_hosts_step_back_a_leafs_round_back_reads_as_a_restart() -> None:
    """A host that learned the round after the one the leaf took back open reads the leaf's
    STALE_ROUND for that round as a new switch state, and its call aborts."""
    problems, _ = simulate(STEP_BACK_HOST, faults={"no_step_back": True})
    assert any("ended 'reset'" in p for p in problems), problems
    assert simulate(STEP_BACK_HOST)[0] == []


# Seeds where a rack's hosts make their last calls with flights unsettled at their leaf: a
# spine verdict lost on the way down (33, 295), an uplink lost on the way up (987), a spine
# result that skipped the rack lost (1075), and 401 (seed 400's close held while a sum was
# at the spine no longer comes about since a partial call keeps its order through the call,
# docs/protocol.md §9 bounded staleness, which shifts the schedule).
LAST_CALL = (33, 295, 401, 987, 1075)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", LAST_CALL)
def test_hosts_past_their_last_call_keep_the_leaf_moving(seed: int, target: str) -> None:
    problems, stats = simulate(seed, target)
    assert problems == []
    assert stats["hosts_draining"] > 0


@pytest.mark.parametrize("seed", LAST_CALL)
def test_hosts_that_stop_at_their_last_call_stall_the_other_racks(seed: int) -> None:
    """Without the host's rule of §11 the leaf waits for a packet that never comes, and the
    spine's round waits on that rack: the other racks' calls fail, and the checker does not
    take it for a round waiting on hosts that left (end_behind)."""
    problems, _ = simulate(seed, drain=False)
    failures = [p for p in problems if p.startswith("failure:")]
    assert failures and all("spine round" in p for p in failures), problems


# Fair races (equal-pace racks, the spine in partial(1)) where, without the host's rule for a
# relayed result without its bit, the rack that loses the first race loses every later one.
FAIR = (1, 2, 5, 6)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", FAIR)
def test_equal_pace_racks_share_a_partial_spine(seed: int, target: str) -> None:
    problems, counts = fairness(seed, target)
    assert problems == []
    assert min(counts) > 0


@pytest.mark.parametrize("seed", FAIR)
def test_hosts_that_wait_for_their_retransmission_leave_their_rack_out(seed: int) -> None:
    """A host that settles a round its rack lost only on the answer to its own retransmission
    starts its next call an RTO after the winners: the other rack's sum wins the next race
    too, and every one after it while the hosts are calling."""
    problems, counts = fairness(seed, faults={"leaf_verdict_waits": True})
    assert 0 in counts
    assert any(p.startswith("fairness:") for p in problems), problems
