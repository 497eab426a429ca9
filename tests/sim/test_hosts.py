"""Members that are hosts of several ranks in the simulation (tests/sim/hosts.py,
docs/protocol.md §10 invariant 8): seeds of hosts of 1-8 ranks and of 128 ranks on 32
hosts pass; the simulated reduction is real gloo's, bit for bit; one rank per host is the
run without hosts; and the per-rank checks catch a rank dropped from its host's reduction
and a rank that does not apply its leader's result.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from hysync.host_group import Applied, HostGroup, HostLayout

from .check import _bare_spans, check
from .hosts import draw_gradients, reduce_mean
from .plan import (
    FAULT_KINDS,
    HELD_RESULT_AS_FOUND,
    HOST_KINDS,
    HOSTS_DRAWN,
    PROBE_PERIOD_AS_FOUND,
    SCALE,
    Plan,
    draw,
)
from .run import Call, Sim, Worker, simulate

# About a minute on a loaded 2-core machine.
HOST_SEEDS = 60          # hosts of 1-8 ranks, every fault kind
PER_HOST_KIND = 6        # each fault inside a host on its own
BIG_JOB_SEEDS = 2        # 128 ranks on 32 hosts


def _run(plan: Plan, target: str, hosts: str) -> None:
    rec, sim = simulate(plan, target)
    found = check(rec, sim)
    assert not found, (f"seed {plan.seed} on {target}: {found[0]}\n  reproduce: make simulate "
                       f"SEED={plan.seed} TARGETS={target} HOSTS={hosts}")


def test_seeds_of_hosts_of_one_to_eight_ranks() -> None:
    ranks = set()
    for seed in range(HOST_SEEDS):
        plan = draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
        ranks.add(plan.ranks_per_host)
        _run(plan, "native", HOSTS_DRAWN)
    assert ranks == set(range(1, 9))


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_each_fault_inside_a_host(kind: str) -> None:
    drawn = 0
    for seed in range(PER_HOST_KIND):
        plan = draw(20_000 + seed, (kind,), HOSTS_DRAWN)
        drawn += kind in plan.kinds()
        _run(plan, "native", HOSTS_DRAWN)
    assert drawn >= PER_HOST_KIND // 2, f"{kind} drawn in {drawn} of {PER_HOST_KIND} seeds"


def test_a_job_of_128_ranks_on_32_hosts() -> None:
    for seed in range(BIG_JOB_SEEDS):
        plan = draw(seed, FAULT_KINDS + HOST_KINDS, "32x4")
        assert (plan.workers, plan.ranks_per_host) == (32, 4)
        _run(plan, "native", "32x4")


# Seeds of hosts of several ranks, each fixed at its cause (docs/protocol.md §10): 1000489,
# 32 hosts in sync with 15% loss each way and no fault, whose first calls failed while every
# member was still in them (rule lossy_straggler: a member's contribution lost again and
# again, its retransmissions one probe per silent window apart). The seeds of partial calls
# whose members' orders departed after an abort are tests/sim/test_races.py's.
# 1001170: a worker already flagged for a resync learns of a restart between calls from a
# STALE reply on one slot and forgets its parked packet on another, which the new state had
# counted: that packet's fate was unknown to it (rule unknown_fate), and the books now note
# every new state learned, not only the first flag.
# 1000100: a call that failed after a death, dead_after after a CHUNK_MISMATCH (a sign of
# life) that named a round the dead member never joined: the rule dead_member's bound starts
# there too.
# 1002826: a CHUNK_MISMATCH sends a worker's chunk and a STALE reply on another slot, read in
# the same instant, shows a new state and drops it: sent before the drop, its fate is unknown
# though both happened at one simulated time (the books order an instant's events).
# 1003408: 32 members in sync after a lossy phase, one a call ahead after its packet deadline;
# its JOINs on slots behind by two rounds were answered by the closed round's RESEND and
# offered again only a join_after later, past the peers' packet deadline (§9 JOIN).
# 1003807: a late copy of a member's older contribution wrote the refusal mark over its newer
# one counted (§4 step 8).
# 1002797, 1003033, 1003213: the job's last reset is a bare restart (no re-install follows);
# a partial member's calls then end by carrying, and no round closes for any chunk: calls
# made while the switch holds no job are not held to invariant 6 (check._bare_spans).
# 1002641: a member dies before a partial round with a quorum of every member latches on a
# slot; the live members' contributions wait in it for ever, also after the swap into async
# (limit "A partial round latched with a member who then died", rule limit_dead_latch).
# 1002377: four members on one slot, in partial with a quorum of every member behind a slow
# switch, locked in two pairs half a call apart: each pair's call of the one-chunk key meets
# the other pair's round of another chunk, joins it and carries its own (limit "Members out
# of step on a partial slot", rule limit_out_of_step).
# 1004571: a re-install counted again an async retransmission the old state had counted; the
# STALE_COUNTED that answered it showed an open round behind the flight's (Replies::on_resync).
# 1007284, 1007640: an async sentinel counted, its RESULT lost, settled by a STALE_COUNTED that
# applies my own lanes (non-finite in the call's output): the books note that apply too.
# 1006182: 32 hosts in sync on a lossy downlink: a member's round answers lost twice in a
# row hold a slot's next round back past a peer's packet deadline (rule lossy_straggler).
# 1007444: a bare restart in a member's pause: its dead timer starts when the pause ends
# (the rule's demonstration is a stored plan: PAUSED_AT_THE_CAUSE, below).
# 1011479, 1011063: a STALE reply sends a flight again to a round that waits for finished
# members: its packet deadline starts afresh (rule end_behind).
# 1005345: the same limit as two groups of five members: chunk 6 displaced by a round of
# another key, or of its own key's chunk the other group went on to, or its slot held.
# 1000427, 1001981, 1015559: partial with quorum 1 behind a slow switch, two members out of
# step race for each round of a slot; a member's first chunk there loses every race to a
# round of another chunk and is carried (limit "Rounds of one raced on a slow switch", rule
# limit_raced).
# 1018875: after a re-add, a call aborted with its packet of chunk 3 in flight, which the new
# state then counted in round 1; the next call's chunk 1, sent at that round, met the switch's
# record of it (STALE_COUNTED) and was settled as counted: a round that closed with my bit on
# another chunk does not count this flight (Flights::counted_without_result).
BARE_AT_THE_END = (1002797, 1003033, 1003213)
LATCHED_WITH_THE_DEAD = (1002641,)
OUT_OF_STEP = (1002377, 1005345)
RACED = (1000427, 1001981, 1015559)
ANSWERS_LOST = (1006182,)
STALE_HEARD = (1011479, 1011063)
HOST_REGRESSIONS = (1000489, 1001170, 1000100, 1002826, 1003408, 1003807, 1004571, 1007284,
                    1007640, 1007444, 1018875,
                    *BARE_AT_THE_END, *LATCHED_WITH_THE_DEAD, *OUT_OF_STEP, *ANSWERS_LOST,
                    *STALE_HEARD, *RACED)
# A bare restart 0.26 s into a member's pause of 1.5 s: seed 1007444's plan with that
# pause lengthened from 0.93 s. A call that waits out a pause gives up dead_after after
# the pause ends (its packets' deadline, docs/protocol.md §9 Failures), so the pause's end
# matters to the bound only where it comes more than 2 rto_max (1 s) after the cause;
# a drawn pause lasts at most dead_after / 3 (1 s), and no host seed of 1000000-1011999
# meets it.
PAUSED_AT_THE_CAUSE = Path(__file__).parent / "plans" / "bare_in_pause.json"
# The schedule the OUT_OF_STEP seeds were found on: no displaced chunk offered again within
# its call (Flights::round_closed). With it, 1002377's schedule differs from 2.25 s on (a
# chunk 1 displaced by a round of its key's chunk 2 is offered again) and 1005345's from
# 11.65 s on (chunk 6, displaced by a round of its key's chunk 12, the limit's second form,
# is offered again); neither meets the limit then (each still passes, HOST_REGRESSIONS).
# The check's reading of the limit does not depend on the re-offer. Nor on a call's wait of one
# RTO for the answer of a parked packet that holds its slot, whose timer fell due between
# calls (Flights::start_call): carried at once, as they were found (Faults::
# carry_held_at_start); with the wait 1005345's schedule differs from 13.51 s on, and the
# limit is not met. Nor on a partial packet parked at its first timeout before any RTT sample
# leaving the RTO as it was, as they were found (Faults::park_keeps_unlearned_rto): with the
# RTO backed off there, neither seed meets the limit (each still passes).
OUT_OF_STEP_FOUND_ON = {"faults": {"no_reoffer": True, "carry_held_at_start": True,
                                   "park_keeps_unlearned_rto": True}}
# Seed 1015559 of RACED meets its limit only with a partial packet parked at its first
# timeout before any RTT sample leaving the RTO as it was, as it was found (Faults::
# park_keeps_unlearned_rto); with the RTO backed off there it passes without meeting it.
RACED_FOUND_ON = {1015559: {"faults": {"park_keeps_unlearned_rto": True}}}


@pytest.mark.parametrize("seed", HOST_REGRESSIONS)
def test_host_regressions(seed: int) -> None:
    _run(draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN), "native", HOSTS_DRAWN)


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_round_latched_with_the_dead_is_the_limit_on_both_pipelines(target: str) -> None:
    """The slot's open round at the end counts a dead member in its quorum and cannot close:
    its chunks' starvation is the limit, counted, not a pass; and only that case."""
    rec, sim = simulate(draw(LATCHED_WITH_THE_DEAD[0], FAULT_KINDS + HOST_KINDS,
                             HOSTS_DRAWN), target)
    assert check(rec, sim) == []
    assert rec.excused.get("limit_dead_latch", 0) >= 1
    pl, s = sim.switch.pipeline, rec.plan.slot_base
    assert (pl.mode[s], pl.quorum[s], pl.count[s]) == (1, 0, 2)  # partial, every member, 2 of 3
    for seed in BARE_AT_THE_END:
        rec, sim = simulate(draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN), target)
        assert check(rec, sim) == [] and "limit_dead_latch" not in rec.excused


def test_without_either_exclusion_the_pinned_seeds_starve(monkeypatch) -> None:
    """Each exclusion taken out, its pinned seeds report invariant 6 again: the checker's
    calls made on a switch without the job, and the round latched with the dead. (On the
    schedule the seeds were found on, plan.HELD_RESULT_AS_FOUND: on the engine's own, 1002797
    and 1003033 do not meet the case, and report nothing without the exclusion either.)"""
    from . import check as checker
    monkeypatch.setattr(checker, "_bare_spans", lambda rec: [])
    for seed in BARE_AT_THE_END:
        rec, sim = simulate(draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN), "native",
                            faults=HELD_RESULT_AS_FOUND)
        assert any(v.startswith("starvation") for v in check(rec, sim)), seed
    monkeypatch.undo()
    monkeypatch.setattr(checker, "_latched_with_dead", lambda rec, sim, chunk: False)
    rec, sim = simulate(draw(LATCHED_WITH_THE_DEAD[0], FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN),
                        "native")
    assert any(v.startswith("starvation") for v in check(rec, sim))


@pytest.mark.parametrize("target", ["native", "python"])
def test_members_out_of_step_on_a_partial_slot_is_the_limit_and_only_it(target: str) -> None:
    """Seed 1002377's starved chunk was displaced by a CHUNK_MISMATCH in every call judged:
    the limit, counted; without its displacements on record it is starvation again, and the
    limit of rounds raced (a RESEND carried, no CHUNK_MISMATCH) does not take it."""
    plan = draw(OUT_OF_STEP[0], FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
    rec, sim = simulate(plan, target, **OUT_OF_STEP_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    rec, sim = simulate(plan, target, **OUT_OF_STEP_FOUND_ON)
    for wk in sim.workers:
        wk.displaced.clear()
    assert any(v.startswith("starvation") for v in check(rec, sim))
    assert "limit_raced" not in rec.excused


@pytest.mark.parametrize("target", ["native", "python"])
def test_rounds_raced_on_a_slow_switch_is_the_limit_and_only_it(target: str) -> None:
    """Seeds 1000427, 1001981 and 1015559: partial with quorum 1 behind a slow switch, two
    members out of step; each starved chunk lost the race for a round of another chunk in
    every call judged (a RESEND, carried): the limit, counted. Without the races on record,
    or on a switch that is not slow, it is starvation again; and the seeds of the limit
    "Members out of step on a partial slot" are not taken by it."""
    for seed in RACED:
        plan = draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
        found_on = RACED_FOUND_ON.get(seed, {})
        assert plan.switch_delay > 0, seed
        rec, sim = simulate(plan, target, **found_on)
        assert check(rec, sim) == [] and rec.excused.get("limit_raced", 0) >= 1, seed
        assert any(q == 1 for wk in sim.workers for _t, _d, _o, q, _sent in wk.raced), seed
        for wk in sim.workers:
            wk.raced.clear()
        rec.excused.clear()
        assert any(v.startswith("starvation") for v in check(rec, sim)), seed
        rec, sim = simulate(plan, target, **found_on)
        rec.plan = replace(plan, switch_delay=0.0)  # (read by the check only)
        assert any(v.startswith("starvation") for v in check(rec, sim)), seed
    for seed in OUT_OF_STEP:
        rec, sim = simulate(draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN), target,
                            **OUT_OF_STEP_FOUND_ON)
        assert check(rec, sim) == [] and "limit_raced" not in rec.excused, seed


# The schedule seeds 1006182 and 1011479 were found on: a partial call's order drawn at its
# start only, no displaced chunk offered again within its call, a call's chunks on a slot
# held by a parked packet whose timer fell due between calls carried at once, and a parked
# packet sent again at once into a slot reported async. Keeping the order through the call
# (Flights::round_closed), the re-offer, or the wait of one RTO for the held packet's answer
# (Flights::start_call) shifts both schedules, and neither seed meets its situation then
# (each still passes, HOST_REGRESSIONS); the checker's bounds they show depend on none of
# them. 1011479 meets its situation only with the immediate resend into async
# (Faults::hurry_into_async). Both were found before a JOIN that a round closed without it
# answered (RESEND) was offered at once at the slot's next round (Faults::
# join_left_out_waits): that shifts 1006182's schedule off its situation. And before a
# partial packet parked at its first timeout with no RTT sample yet backed the RTO off
# (Faults::park_keeps_unlearned_rto): that shifts 1011479's schedule off its situation. And
# before a partial RESULT closed by another member's contribution gave no RTT sample
# (plan.HELD_RESULT_AS_FOUND): that shifts both off their situations.
FOUND_ON = {"faults": {"order_at_start": True, "no_reoffer": True, "carry_held_at_start": True,
                       "hurry_into_async": True, "join_left_out_waits": True,
                       "park_keeps_unlearned_rto": True, **HELD_RESULT_AS_FOUND}}
# Seed 1011063's and PAUSED_AT_THE_CAUSE's: the probe period read as a difference
# (plan.PROBE_PERIOD_AS_FOUND); each still passes without it. Seed 1011063 was also found
# before a call waited one RTO for a held slot's answer (carry_held_at_start), and before a
# JOIN answered by a RESEND without its bit went at once to the next round
# (join_left_out_waits), which shifts it off its situation too.
PROBE_FOUND_ON = {"faults": PROBE_PERIOD_AS_FOUND}
STALE_1011063_FOUND_ON = {"faults": {**PROBE_PERIOD_AS_FOUND, "carry_held_at_start": True,
                                     "join_left_out_waits": True}}
# Seed 1011479 was also found before a slot reported async held its next contribution until
# the last copy of its latest sync-style packet was one RTO old (Faults::
# launch_past_sync_copy): that wait shifts it off its STALE reply's situation too (it still
# passes).
STALE_1011479_FOUND_ON = {"faults": {**FOUND_ON["faults"], "launch_past_sync_copy": True}}
# Seed 1006182 was also found before the packet deadline counted from the last RESULT heard
# whose bitmap holds every member (Faults::flight_deadline_from_launch, seed 9132941): counted
# from there, the peer's packet deadline no longer comes before the straggler's round closes,
# and no call fails (it still passes).
ANSWERS_LOST_FOUND_ON = {"faults": {**FOUND_ON["faults"], "flight_deadline_from_launch": True}}


def test_a_member_held_back_by_its_answers_lost_is_a_lossy_straggler(monkeypatch) -> None:
    """Seed 1006182: 32 hosts in sync, a sixth of the RESULTs lost downstream. A member
    ahead that had JOINed a round lost its RESULT, then the RESEND its probe met, and held
    the slot's next round back past a peer's packet deadline: `lossy_straggler`, counted;
    without the answers' losses on record it is a failure no rule allows."""
    from . import check as checker
    plan = draw(ANSWERS_LOST[0], FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
    rec, sim = simulate(plan, "native", **ANSWERS_LOST_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("lossy_straggler", 0) >= 1
    failed = [c for wk in sim.workers for c in wk.calls if c.status == "unreachable"]
    assert failed and all(c.waiting for c in failed)  # the slots it gave up on, from its log
    monkeypatch.setattr(checker, "_answers_lost", lambda rec, call, since, live: False)
    assert any(v.startswith("failure: worker 15 call 2") for v in check(rec, sim))


def test_a_cause_met_in_a_pause_counts_from_its_end(monkeypatch) -> None:
    """A bare restart comes 0.26 s into a member's 1.5 s pause (PAUSED_AT_THE_CAUSE); its
    call fails 'unreachable' within the bound counted from the pause's end (the first packet
    it can send), not from the restart: `bare_unreachable`. Counted from the restart it is a
    failure no rule allows."""
    from . import check as checker
    plan = Plan.from_json(PAUSED_AT_THE_CAUSE.read_text())
    rec, sim = simulate(plan, "native", **PROBE_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("bare_unreachable", 0) >= 1
    monkeypatch.setattr(checker, "_awake", lambda rec, wk, cause: cause)
    assert any(v.startswith("failure: worker 1 call 0") for v in check(rec, sim))


def test_a_stale_reply_heard_restarts_the_bound_of_a_gone_member() -> None:
    """Seed 1011479: 32 hosts, members finished and two dead; after a re-install the slot's
    async rounds moved on while a member's probe waited, a STALE_ROUND sent its flight again
    to the open round, latched sync with the finished members, and that packet's deadline
    failed the call: `dead_member` or `end_behind`, counted from the STALE reply. Seed
    1011063 likewise (a swap's async rounds, a member finished; its schedule differs from
    0.82 s on where a call waits one RTO for a held slot's answer, and it is replayed
    without that wait). Without the STALE replies on record each is a failure no rule
    allows."""
    for seed, failed, found_on in zip(STALE_HEARD, ("worker 4 call 4", "worker 2 call 5"),
                                      (STALE_1011479_FOUND_ON, STALE_1011063_FOUND_ON),
                                      strict=True):
        plan = draw(seed, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
        rec, sim = simulate(plan, "native", **found_on)
        assert check(rec, sim) == [], seed
        assert rec.excused.get("end_behind", 0) + rec.excused.get("dead_member", 0) >= 1, seed
        for wk in sim.workers:
            wk.stales_heard.clear()
        assert any(v.startswith("failure: " + failed) for v in check(rec, sim)), seed


def test_two_groups_out_of_step_on_a_partial_slot_are_the_limit(monkeypatch) -> None:
    """Seed 1005345: five members left of eight, partial with a quorum of all five behind a
    0.93 s switch, run as two groups half a call apart. Key 0's chunk 6 meets the other
    group's round of key 2's chunk, or of key 0's chunk 12 that group went on to once its
    own chunk 6 was displaced so, or finds its slot held by the member's own packet of an
    earlier call: the limit, counted. Read as the first form alone (no chain, no held
    slot), it is starvation again."""
    from . import check as checker
    plan = draw(OUT_OF_STEP[1], FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
    rec, sim = simulate(plan, "native", **OUT_OF_STEP_FOUND_ON)
    assert check(rec, sim) == [] and rec.excused.get("limit_out_of_step", 0) >= 1
    monkeypatch.setattr(checker, "_displaced_before", lambda wk, chunk, keyed, t: False)
    for wk in sim.workers:
        for call in wk.calls:
            call.held = frozenset()
    assert any(v.startswith("starvation") for v in check(rec, sim))


def test_bare_spans_end_at_the_next_install() -> None:
    """A bare restart's stretch ends when a later restart or re-add installs the job again
    (after its length), and runs to the end where none follows."""
    plan = draw(1003033, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)
    bare = next(f for f in plan.faults if f.kind == "restart_bare")
    readd = replace(bare, at=bare.at + 0.05, kind="readd", length=0.01)
    rec, _ = simulate(replace(plan, faults=tuple(sorted(plan.faults + (readd,),
                                                        key=lambda f: f.at))), "native")
    assert _bare_spans(rec) == [(bare.at, readd.at + 0.01)]
    rec, _ = simulate(plan, "native")
    assert _bare_spans(rec) == [(bare.at, float("inf"))]


def test_one_rank_per_host_is_the_run_without_hosts() -> None:
    """With R = 1 and no fault inside a host, a seed is its plan without hosts, run alike."""
    for seed in range(5):
        plain = draw(seed)
        hosted = draw(seed, FAULT_KINDS, f"{plain.workers}x1")
        assert hosted == plain
        a, sim = simulate(hosted, "native")
        b, _ = simulate(plain, "native")
        assert not any(wk.ranks for wk in sim.workers)
        assert (a.packets, a.swaps, a.sim_seconds, a.contribs.__len__()) == \
            (b.packets, b.swaps, b.sim_seconds, len(b.contribs))


def test_bad_host_layouts_are_refused_in_one_line() -> None:
    for bad in ("33x4", "4x9", "1x2", "four"):
        with pytest.raises(ValueError, match=r"'drawn' \(1-8 ranks per host, drawn per "
                                             r"seed\) or HxR"):
            draw(1, FAULT_KINDS, bad)


def _gloo_host(grads: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """hysync.host_group.HostGroup on real gloo, one thread per rank: every rank's tensor
    after the host's all-reduce through an identity switch, and what the leader handed the
    switch."""
    ranks = len(grads)
    store = dist.HashStore()
    outputs: list[np.ndarray] = [np.empty(0)] * ranks
    handed: list[np.ndarray] = []
    errors: list[BaseException] = []

    def switch(tensor: torch.Tensor) -> Applied:
        handed.append(tensor.numpy().copy())
        return Applied(1.0, False)

    def rank(local: int) -> None:
        try:
            group = HostGroup(store, HostLayout(1, ranks, 0, local), timeout=60)
            tensor = torch.from_numpy(grads[local].copy())
            group.allreduce(tensor, switch if local == 0 else None).wait()
            outputs[local] = tensor.numpy().copy()
            group.close()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return outputs, handed[0]


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_the_simulated_reduction_is_gloos(ranks: int) -> None:
    """hosts.reduce_mean gives the bits host_group.py's gloo reduce and division give, the
    simulation's gradients (exact) and non-finite ones alike."""
    rng = np.random.default_rng(ranks)
    grads = (draw_gradients(rng, ranks, 200) / SCALE).astype(np.float32)
    grads[0, 3], grads[ranks - 1, 7], grads[1, 9] = np.nan, np.inf, 1e30
    grads[0, 11], grads[1, 11] = np.inf, -np.inf
    outputs, handed = _gloo_host(grads)
    want = reduce_mean(grads)
    assert np.array_equal(handed.view(np.uint32), want.view(np.uint32))
    for out in outputs:
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    exact = np.delete(want, [3, 7, 9, 11]) * SCALE
    assert np.array_equal(exact, np.rint(exact))  # the mean is exact in fixed point


# --------------------------------------------------------------- the per-rank checks
# A seed of hosts of several ranks that passes (asserted below with the mutation out).
MUTATED_SEED = 3


def _mutated_plan() -> Plan:
    plan = draw(MUTATED_SEED, FAULT_KINDS, "4x3")
    return replace(plan, nonfinite=())


class DropsARank(Sim):
    """Host 0's reduction leaves rank 1's gradient out of call 2 (the sum of the others,
    still divided by R)."""

    def _host_reduce(self, wk: Worker, index: int, grads: np.ndarray) -> np.ndarray:
        if wk.w == 0 and index == 2:
            grads = grads.copy()
            grads[1] = 0
        return super()._host_reduce(wk, index, grads)


class SkipsABroadcast(Sim):
    """Host 0's rank 2 keeps its own buffer in call 1 instead of its leader's result."""

    def _host_broadcast(self, wk: Worker, call: Call) -> None:
        super()._host_broadcast(wk, call)
        if wk.w == 0 and call.index == 1 and call.status == "done":
            index, ok, done, flag, output = wk.ranks[2].outputs[-1]
            assert output is not None
            wk.ranks[2].outputs[-1] = (index, ok, done, flag, output + np.float32(1 / SCALE))


class FallsBehind(Sim):
    """Host 1's rank 1 never hears how its leader's last call ended."""

    def _host_broadcast(self, wk: Worker, call: Call) -> None:
        super()._host_broadcast(wk, call)
        if wk.w == 1 and len(wk.calls) == self.plan.calls * len(self.plan.sizes):
            wk.ranks[1].outputs.pop()


@pytest.mark.parametrize("mutant, report", [
    (DropsARank, "exactly-once: host 0 key"),
    (SkipsABroadcast, "agreement: host 0 rank 2 applied"),
    (FallsBehind, "agreement: host 1 rank 1 is behind its leader"),
])
def test_the_per_rank_checks_catch_a_host_that_fails_a_rank(mutant: type[Sim],
                                                             report: str) -> None:
    plan = _mutated_plan()
    sim = Sim(plan, "python")
    rec = sim.run()
    assert check(rec, sim) == [], "the seed must pass unmutated"
    sim = mutant(plan, "python")
    rec = sim.run()
    found = check(rec, sim)
    assert any(v.startswith(report) for v in found), found
