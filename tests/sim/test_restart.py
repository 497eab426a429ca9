"""A switch restart mid-training, in every mode (docs/protocol.md §9, "A switch that lost
the job's state"): with the job added again, every call completes or fails at once with
SwitchRestartedError's reason and the job goes on; without it, every call fails within
dead_after. Never a livelock."""

from __future__ import annotations

import pytest

from .check import _members_gone, check
from .plan import ASYNC, DEAD_AFTER, PARTIAL, RTO_MAX, SYNC, Fault, Link, Plan, draw
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


# Async, 2 workers: the job is removed and added again while worker 0's first contributions
# (sent before it knew the slots' rounds) are in flight. The new state counts them in round 0,
# a number worker 0 applied already (worker 1's, of the old state).
ROUND_APPLIED_ALREADY = Plan.from_json(
    '{"seed":284,"workers":2,"slots":5,"slot_base":47,"sizes":[65],"calls":1,"mode":2,'
    '"quorum":2,"up":{"loss":0.0141,"dup":0.0329,"delay":0.00035,"jitter":0.005,'
    '"fifo":false},"down":{"loss":0.0,"dup":0.0,"delay":0.00165,"jitter":0.0,"fifo":false},'
    '"compute":0.002,"faults":[{"at":0.00195,"kind":"readd","mode":0,"quorum":0,"worker":0,'
    '"length":0.01}],"faults_end":0.299,"lossy_until":0.0009}')


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize(("plan", "told"), [
    # the new state counts each worker's next contribution in a round below the one the slot
    # had reached when it was sent (swaps, re-adds, restarts; drawn by seed 200)
    (draw(200, ("readd", "restart", "swap")), (0, 1)),
    (ROUND_APPLIED_ALREADY, (0,)),
], ids=["below-the-slot's-round", "a-round-applied-already"])
def test_an_async_worker_learns_of_new_state_from_its_own_contribution(
        plan: Plan, told: tuple[int, ...], target: str) -> None:
    """Async replies carry no sign of the switch's state: an async worker learns that it is
    new when the switch counts its own contribution in a round that cannot be the old
    state's. The call aborts (SwitchRestartedError's reason) and the replica is flagged, so
    results of the new state that it took for duplicates are not lost silently."""
    rec, sim = simulate(plan, target)
    assert not check(rec, sim)
    for w in told:
        wk = sim.workers[w]
        assert any(c.status == "reset" for c in wk.calls), [c.status for c in wk.calls]
        assert wk.engine.needs_resync
