"""A switch restart mid-training, in every mode (docs/protocol.md §9, "A switch that lost
the job's state"): with the job added again, every call completes or fails at once with
SwitchRestartedError's reason and the job goes on; without it, every call fails within
dead_after. Never a livelock."""

from __future__ import annotations

import pytest

from .check import _members_gone, check
from .plan import ASYNC, DEAD_AFTER, PARTIAL, RTO_MAX, SYNC, Fault, Link, Plan
from .run import simulate

MODES = [(SYNC, 0), (PARTIAL, 3), (PARTIAL, 0), (ASYNC, 0)]


def _plan(mode: int, quorum: int, kind: str, seed: int) -> Plan:
    lossy = Link(loss=0.05, dup=0.02, delay=0.0005, jitter=0.0005)
    return Plan(seed=seed, workers=4, slots=4, slot_base=8, sizes=(300, 64), calls=10,
                mode=mode, quorum=quorum, up=lossy, down=lossy, compute=0.002,
                faults=(Fault(0.05, kind, length=0.01),), faults_end=0.06, lossy_until=0.06)


@pytest.mark.parametrize("kind", ["restart", "readd"])
@pytest.mark.parametrize(("mode", "quorum"), MODES)
def test_state_lost_and_job_added_again(mode: int, quorum: int, kind: str) -> None:
    for seed in range(3):
        rec, sim = simulate(_plan(mode, quorum, kind, seed), "native")
        assert not check(rec, sim)
        for wk in sim.workers:
            for c in wk.calls:
                if c.status == "reset":
                    assert c.end - 0.05 < DEAD_AFTER
                elif c.status == "unreachable":
                    # A worker a call behind its peers when the switch restarted stays a call
                    # behind: its last call finds them gone (docs/protocol.md §10).
                    assert _members_gone(rec, sim, c.end, c.start), (wk.w, c)
            # The job goes on after the restart.
            assert any(c.status == "done" and c.start > 0.06 for c in wk.calls), wk.w


@pytest.mark.parametrize(("mode", "quorum"), MODES)
def test_restart_without_the_job_fails_within_dead_after(mode: int, quorum: int) -> None:
    rec, sim = simulate(_plan(mode, quorum, "restart_bare", 1), "native")
    assert not check(rec, sim)
    bound = 0.05 + DEAD_AFTER + RTO_MAX  # dead_after from the first unanswered packet
    for wk in sim.workers:
        # Partial-mode calls may end by carrying their chunks until then (a short job may
        # end so); none after it.
        assert all(c.status == "unreachable" for c in wk.calls if c.end > bound)
        failed = [c for c in wk.calls if c.status == "unreachable"]
        assert failed or mode == PARTIAL
        if failed:
            assert failed[0].end <= bound
            later = wk.calls[wk.calls.index(failed[0]):]
            assert all(c.status == "unreachable" for c in later)
            assert all(c.end - c.start <= DEAD_AFTER + RTO_MAX for c in later)
