"""The starvation seeds of the 100,000-seed sweep from seed 9000000 (one rank per member;
docs/protocol.md §10, "Committed sweeps"): all run clean on both data planes; those of a
worker bug fail again with its fix taken out, and the one of a limit reports starvation again
when the limit's condition is not met.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hysync import wire

from . import check as checker
from .check import check
from .plan import HELD_RESULT_AS_FOUND, draw
from .run import simulate

# A partial call draws its slots' order (least recently closed first) at its start; a round
# that then closed with a chunk still queued there (a packet of an earlier call, parked into
# this one) left that chunk first, the call opened the slot's next round with it again and
# displaced the chunk the others sent, call after call (Flights::round_closed).
ORDER_AFTER_A_CLOSE = (9001077, 9016450, 9021151, 9024099, 9025540)
# With that order back, 9021151's starved member meets a round of another key's chunk in
# every call judged, its last one's answered after that call ended: the check reads it as
# the limit "Members out of step on a partial slot" and cannot tell it from the bug there.
ORDER_AFTER_A_CLOSE_REPORTED = tuple(s for s in ORDER_AFTER_A_CLOSE if s != 9021151)
# Two members half a call apart on one slot of a key's chunks 0-2 behind a slow switch: each
# call's chunk 1 met the round the other had opened with its last chunk (CHUNK_MISMATCH),
# joined it and carried chunk 1 to the key's next call, where the same came again. A partial
# call now offers such a chunk again once the round that displaced it closes.
DISPLACED_AGAIN = 9019721
# Found by the sweep's continuation from 9040750, each of another cause than the chain
# above (§10 says which); the re-offer shifts their schedules, and both run clean.
SHIFTED = (9044725, 9049237)
# Six members in two groups behind a switch 0.52 s slow, partial with a quorum of all six: a
# member's call of key 2 found its one chunk's slot held by its parked packet of the call
# before, whose timer had fallen due between calls; run first, that timer carried the chunk
# at once and the call ended at its start. The member ran a call ahead of its group, and in
# its last call of key 1 its chunks 36-39, third on their slots, met the others' rounds of
# key 0 (CHUNK_MISMATCH) and reached no round. A call now hurries a held slot's packet before
# the timers due between calls run, and waits one RTO for its answer (Flights::start_call).
HELD_AT_START = 9061714
# Replayed as it was found: a partial packet parked at its first timeout before any RTT sample
# leaves the RTO as it was (Faults::park_keeps_unlearned_rto), and a partial RESULT closed by
# another member's contribution gives an RTT sample (plan.HELD_RESULT_AS_FOUND). Either way the
# RTO moves the schedule: worker 1's call 5 no longer ends at its start with the held slot's
# timer run first, and the seed passes with that order too.
HELD_AT_START_FOUND_ON = {"park_keeps_unlearned_rto": True, **HELD_RESULT_AS_FOUND}
# Limit "Rounds of one raced on a slow switch", quorum 2 of 5: the members in three groups in
# calls of different keys; key 2's chunk 12 loses every race to a round of key 0's chunks.
RACED_BY_A_QUORUM = 9014497
# Limit "Members out of step on a partial slot", behind a switch 0.09 s slow: four members,
# partial with a quorum of 3, on one slot of key 0's chunks 0 and 1 and key 1's chunk 2. Key
# 1's chunk meets the others' round of key 0 still open (CHUNK_MISMATCH) in most calls and,
# in one call of each of two members, closed already (RESEND).
OUT_OF_STEP_OPEN_OR_CLOSED = 9014513
# The same limit where the round that displaced the starved chunk is of a chunk of its own
# key: the member that opened it sent that chunk after a round of another key had displaced
# its copy of the starved chunk; every other member in it had joined it, displaced into it
# like the member judged.
OUT_OF_STEP_OPENED_BY_DISPLACED = 9018072
# That shape where the round stays open across its members' calls: eight members, partial
# with a quorum of all, in calls of three keys on a slot of key 0's chunks 2 and 8 and key
# 2's chunks 14 and 20. A member's chunk 8 was displaced by key 2's chunk 20 and it opened
# the slot's next round with chunk 2; the others joined it, displaced, each in a call of its
# own, and it closed half a second later: members the starved chunk met there had entered it
# calls before the one they were in.
OUT_OF_STEP_ACROSS_CALLS = 9019419
# Replayed as it was found: the packet deadline counted from the packet's launch only
# (Faults::flight_deadline_from_launch). Counted from the last RESULT heard of every member
# (seed 9132941's fix), the schedule moves off the limit's case and the seed passes without it;
# so it does with a flight whose round closed with my bit on another chunk sent again at once
# (seed 10036437's fix; Faults::closed_by_my_other_waits_rto takes it out).
ACROSS_CALLS_FOUND_ON = {"flight_deadline_from_launch": True,
                         "closed_by_my_other_waits_rto": True}
# The same limit behind a switch 0.1 s slow, where a call of a one-chunk key ends 5 ms after
# sending its chunk, parked in a round: the CHUNK_MISMATCH of another key's round answers it
# in the worker's next call, of another key.
OUT_OF_STEP_ANSWERED_LATER = 9044398
# The same limit behind a switch 0.08 s slow, eight members, partial with a quorum of 4 on
# seven slots, in calls of three keys: key 2's chunks 14 and 21 share a slot. A call's chunk
# 14 is parked 5 ms after it leaves (or its contribution to the round of key 0 that displaced
# 14 is) and chunk 21 carried behind it, unsent; the answer to 14, a round of key 0's chunk
# open (CHUNK_MISMATCH) or closed (RESEND), is 21's turn too. And one call's chunks meet
# those rounds open on some slots and closed on others.
OUT_OF_STEP_BEHIND_A_PARKED_PACKET = 9063516
# The schedule the seeds of a worker change before that wait were found on: a call's chunks
# on a slot held by a parked packet whose timer fell due between calls carried at once. The
# wait shifts their schedules (9016450 from 0.11 s, 9021151 from 1.57 s and 9024099 from
# 1.61 s on), and with their fix taken out they run clean on the shifted ones. Found, too,
# with a partial RESULT closed by another member's contribution taken for an RTT sample
# (plan.HELD_RESULT_AS_FOUND), without which 9001077, 9016450 and 9024099 miss their case.
CARRY_HELD_AT_START = {"carry_held_at_start": True}
# The limits' seeds below (9018072, 9019419, 9044398, 9063516, 9127363) were found with a
# partial RESULT closed by another member's contribution taken for an RTT sample; on the
# engine's own each runs clean without meeting its limit, and each replays as it was found
# (the check's reading of a limit does not depend on what the RTO learned).
LIMIT_FOUND_ON = HELD_RESULT_AS_FOUND


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", (*ORDER_AFTER_A_CLOSE, RACED_BY_A_QUORUM, DISPLACED_AGAIN,
                                  *SHIFTED, HELD_AT_START))
def test_the_sweeps_starvation_seeds_run_clean(seed: int, target: str) -> None:
    rec, sim = simulate(draw(seed), target)
    found = check(rec, sim)
    assert not found, f"seed {seed} on {target}: {found[0]}"


@pytest.mark.parametrize("seed", ORDER_AFTER_A_CLOSE_REPORTED)
def test_with_the_order_drawn_at_the_start_only_the_seeds_starve(seed: int) -> None:
    """With the re-offer out too: a displaced chunk offered again once the round that
    displaced it closes reaches a round in these seeds as well."""
    rec, sim = simulate(draw(seed), "python", faults={"order_at_start": True,
                                                      "no_reoffer": True,
                                                      **CARRY_HELD_AT_START,
                                                      **HELD_RESULT_AS_FOUND})
    assert any(v.startswith("starvation") for v in check(rec, sim)), seed


@pytest.mark.parametrize("target", ["native", "python"])
def test_without_the_re_offer_the_displaced_chunk_starves(target: str) -> None:
    rec, sim = simulate(draw(DISPLACED_AGAIN), target, faults={"no_reoffer": True})
    assert any(v.startswith("starvation: worker 0's chunk(s) [1] of key 0")
               for v in check(rec, sim))


def test_a_race_lost_to_a_quorum_of_another_key_is_the_limit_and_only_it() -> None:
    """Counted by limit_raced; with the races of a quorum above 1 off the record, or on a
    switch that is not slow, it is starvation again."""
    plan = draw(RACED_BY_A_QUORUM)
    rec, sim = simulate(plan, "native")
    assert check(rec, sim) == [] and rec.excused.get("limit_raced", 0) >= 1
    assert all(q == 2 for wk in sim.workers for _t, _d, _o, q, _sent in wk.raced)
    for wk in sim.workers:
        wk.raced = [r for r in wk.raced if r[3] == 1]
    rec.excused.clear()
    assert any(v.startswith("starvation") for v in check(rec, sim))
    rec, sim = simulate(plan, "native")
    rec.plan = replace(plan, switch_delay=0.0)  # (read by the check only)
    assert any(v.startswith("starvation") for v in check(rec, sim))


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_call_on_a_held_slot_waits_for_its_answer(target: str) -> None:
    """Worker 1's call 5 (key 2) starts with its one chunk's slot held by its parked packet
    of call 4. With that packet's due timer run first, the call ends at its start and chunks
    36-39 of key 1 starve; with the packet hurried first, the call waits for its answer, the
    schedule is the same until then (9.095 s), and every chunk reaches a round."""
    plan = draw(HELD_AT_START)
    rec, sim = simulate(plan, target, faults={**HELD_AT_START_FOUND_ON, **CARRY_HELD_AT_START})
    call = sim.workers[1].calls[5]
    assert (call.key, call.held) == (2, frozenset({(28, 28), (29, 13), (30, 14), (31, 15)}))
    assert call.end == call.start
    assert any(v.startswith("starvation: worker 1's chunk(s) [36, 37, 38, 39] of key 1")
               for v in check(rec, sim))
    rec, sim = simulate(plan, target, faults=HELD_AT_START_FOUND_ON)
    call = sim.workers[1].calls[5]
    assert call.held and call.end > call.start
    assert check(rec, sim) == []


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_round_of_another_key_open_or_closed_is_the_limit_and_only_it(target: str) -> None:
    """Counted by limit_out_of_step; without the calls that met the round closed (RESEND) on
    record it is starvation again."""
    rec, sim = simulate(draw(OUT_OF_STEP_OPEN_OR_CLOSED), target)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    assert any(wk.raced for wk in sim.workers)
    for wk in sim.workers:
        wk.raced.clear()
    rec.excused.clear()
    assert any(v.startswith("starvation") and "of key 1" in v for v in check(rec, sim))


# Seed 10003598: a partial call sent a staler chunk of the key first on a slot (least recently
# closed first), a round held for others took it and it was parked, and the call carried the
# fresher chunk 1 behind it; in the two calls after, chunk 1 met the members out of step.
TURN_OF_STALER = 10003598


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_staler_chunks_turn_then_the_members_out_of_step_is_the_limit_and_only_it(
        target: str, monkeypatch) -> None:
    """Counted by limit_out_of_step; without the staler chunk's turn read, or with the
    worker's order read as if the carried chunk had been the staler, it is starvation again."""
    rec, sim = simulate(draw(TURN_OF_STALER), target)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    starved = "starvation: worker 0's chunk(s) [1] of key 0"
    with monkeypatch.context() as m:
        m.setattr(checker, "_turn_of_staler", lambda *_: False)
        rec.excused.clear()
        assert any(v.startswith(starved) for v in check(rec, sim))
    w0 = sim.workers[0]
    for call in w0.calls:  # chunk 7 closed last just before each call: the fresher of the two
        if call.key == 0:
            w0.got.append((call.start - 1e-9, 7))
    rec.excused.clear()
    assert any(v.startswith(starved) for v in check(rec, sim))


# Seed 9127363: a partial call ended with its contribution in flight behind a slow switch; the
# RESEND of a round of another key that had closed without it came in the next call.
RACE_ANSWERED_LATE = 9127363


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_race_answered_after_its_call_ended_is_read_with_that_call(target: str) -> None:
    """Counted (limit_out_of_step's RESEND form); with every raced transmission's send time
    moved before the run, only the answers heard within a call are read, and it is
    starvation again."""
    rec, sim = simulate(draw(RACE_ANSWERED_LATE), target, faults=LIMIT_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    for wk in sim.workers:
        wk.raced = [(t, d, o, q, -1.0) for t, d, o, q, _sent in wk.raced]
    rec.excused.clear()
    assert any(v.startswith("starvation: worker 1's chunk(s) [1, 2] of key 1")
               for v in check(rec, sim))


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_round_opened_by_a_displaced_member_is_the_limit_and_only_it(
        target: str, monkeypatch) -> None:
    """Counted by limit_out_of_step; read as if every member of that round had opened it
    (none joined it displaced), it is starvation again."""
    rec, sim = simulate(draw(OUT_OF_STEP_OPENED_BY_DISPLACED), target, faults=LIMIT_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    monkeypatch.setattr(checker, "_joined", lambda *_: False)
    rec.excused.clear()
    assert any(v.startswith("starvation: worker 1's chunk(s) [8] of key 0")
               for v in check(rec, sim))


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_round_entered_calls_before_is_the_limit_and_only_it(target: str, monkeypatch) -> None:
    """Counted by limit_out_of_step, each member of the displacing round read in the call it
    entered that round in; read in the call it was in when the round displaced the starved
    chunk, or with no member joined displaced, it is starvation again."""
    rec, sim = simulate(draw(OUT_OF_STEP_ACROSS_CALLS), target,
                        faults={**ACROSS_CALLS_FOUND_ON, **LIMIT_FOUND_ON})
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    starved = [f"starvation: worker {w}'s chunk(s) [3, 7, 8] of key 0" for w in (2, 5, 7)]
    with monkeypatch.context() as m:
        m.setattr(checker, "_entered", lambda _rec, _wk, _round, t: t)
        rec.excused.clear()
        assert [v[:len(starved[0])] for v in check(rec, sim)] == starved
    monkeypatch.setattr(checker, "_joined", lambda *_: False)
    rec.excused.clear()
    assert [v[:len(starved[0])] for v in check(rec, sim)] == starved


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_displacement_answered_after_the_call_ended_is_the_limit_and_only_it(
        target: str, monkeypatch) -> None:
    """Counted by limit_out_of_step; with each call's replies read only while it runs, it is
    starvation again."""
    rec, sim = simulate(draw(OUT_OF_STEP_ANSWERED_LATER), target, faults=LIMIT_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    monkeypatch.setattr(checker, "_answered_late", lambda _call, _sent: False)
    rec.excused.clear()
    assert any(v.startswith("starvation: worker 0's chunk(s) [3] of key 2")
               for v in check(rec, sim))


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_chunk_carried_behind_its_slots_parked_packet_is_the_limit_and_only_it(
        target: str) -> None:
    """Counted by limit_out_of_step, each starved chunk read on its own slot; a call's chunk
    21, never sent, is read by its slot's packet of chunk 14, parked on the switch's delay,
    or by the contribution the call joined a round of another key with after that round
    displaced chunk 14. Without the parks on record, or with the answers that met rounds of
    another key off it, it is starvation again."""
    rec, sim = simulate(draw(OUT_OF_STEP_BEHIND_A_PARKED_PACKET), target, faults=LIMIT_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    w1, w2 = sim.workers[1], sim.workers[2]
    keyed = range(w1.firsts[2], w1.firsts[2] + -(-rec.plan.sizes[2] // wire.LANES))
    assert (keyed.start, len(keyed), rec.plan.slots) == (13, 14, 7)  # 14 and 21 on one slot
    call = next(c for c in w1.calls if c.key == 2 and c.start > 3.7)  # 3.748-3.915 s
    assert [c for t, s, c in w1.parks if call.start <= t <= call.end and s == 24] == [14]
    assert checker._carried_behind(rec, w1, call, 21, keyed) == [14]
    assert checker._raced(rec, w1, call, 14, keyed, another_key=True)
    assert not checker._out_of_step(rec, sim, w1, call, 21, keyed)
    assert not checker._raced(rec, w1, call, 21, keyed)
    call = next(c for c in w2.calls if c.key == 2 and c.start > 3.8)  # 3.828-4.087 s
    assert [c for t, s, c in w2.parks if call.start <= t <= call.end and s == 24] == [7]
    assert checker._carried_behind(rec, w2, call, 21, keyed) == [14]
    assert checker._out_of_step(rec, sim, w2, call, 14, keyed)
    # Worker 0's call of 4.063 s met the round of key 0 closed with chunks 14 and 17 and open
    # with chunk 21: the forms mix within a call.
    w0 = sim.workers[0]
    call = next(c for c in w0.calls if c.key == 2 and c.start > 4.0)
    assert all(checker._raced(rec, w0, call, x, keyed, another_key=True) for x in (14, 17))
    assert checker._out_of_step(rec, sim, w0, call, 21, keyed)
    assert not any(checker._out_of_step(rec, sim, w0, call, x, keyed) for x in (14, 17))
    starved = "starvation: worker {}'s chunk(s) [14, 17, 21] of key 2"
    parks = {wk.w: wk.parks for wk in sim.workers}
    for wk in sim.workers:
        wk.parks = []
    rec.excused.clear()
    assert [v[:len(starved) - 1] for v in check(rec, sim)] == [
        starved.format(w) for w in (1, 2, 3, 6, 7)]
    for wk in sim.workers:
        wk.parks = parks[wk.w]
        wk.raced.clear()
        wk.displaced.clear()
    rec.excused.clear()
    assert sum(v.startswith("starvation") and "of key 2" in v for v in check(rec, sim)) == 8
