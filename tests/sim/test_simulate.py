"""A fixed budget of seeds of the deterministic simulation (docs/protocol.md §10) in CI.

Every seed draws its own job and faults (plan.py); a failure names the seed and the
command that replays it. `make simulate` runs many more.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.conformance.tna_model import TnaModelPipeline

from .check import check
from .plan import (
    FAULT_KINDS,
    HELD_RESULT_AS_FOUND,
    PROBE_PERIOD_AS_FOUND,
    STRAGGLER,
    TOFINO,
    Plan,
    draw,
)
from .run import Sim, simulate

# About 1.5 minutes on a loaded 2-core machine: CI_SEEDS seeds on each target, the fault
# kinds drawn freely (tests/sim/plan.py), plus a few seeds per kind on its own.
CI_SEEDS = 100
PER_KIND = 5
# The straggler plans (plan.draw_straggler): a slow member through the adaptive policy's
# async probe and partial phase, then sync; every chunk must keep reaching rounds.
STRAGGLER_SEEDS = 30


def _run(plan: Plan, target: str) -> None:
    rec, sim = simulate(plan, target)
    found = check(rec, sim)
    assert not found, (f"seed {plan.seed} on {target}: {found[0]}\n  reproduce: make simulate "
                       f"SEED={plan.seed} TARGETS={target}")


@pytest.mark.parametrize("target", ["native", "python", "tna-model"])
def test_seeds(target: str) -> None:
    for seed in range(CI_SEEDS):
        _run(draw(seed), target)


def test_tna_model_seeds_within_its_fault_model() -> None:
    """The seeds the TNA model meets in a sweep: within the Tofino program's fault model
    (plan.TOFINO; test_seeds gives it every fault)."""
    for seed in range(CI_SEEDS):
        _run(draw(seed, model=TOFINO), "tna-model")


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind(kind: str) -> None:
    for seed in range(PER_KIND):
        _run(draw(10_000 + seed, (kind,)), "native")


@pytest.mark.parametrize("target", ["native", "python"])
def test_straggler_seeds(target: str) -> None:
    for seed in range(STRAGGLER_SEEDS):
        _run(draw(seed, (STRAGGLER,)), target)


def test_replay_is_exact() -> None:
    """A seed is a complete run: twice the same packets, swaps and simulated time."""
    plan = draw(7)
    a, _ = simulate(plan, "native")
    b, _ = simulate(plan, "native")
    assert (a.packets, a.swaps, a.sim_seconds, a.counted.keys()) == \
        (b.packets, b.swaps, b.sim_seconds, b.counted.keys())
    assert Plan.from_json(plan.to_json()) == plan


# Seeds that once lost or doubled a gradient after mode swaps (kinds swap, storm, pause): a
# round-0 contribution whose partial round closed without its sender was counted by an async
# round after a swap (round 0 taken for a sequence number), and its ACK was taken for "not
# counted", so the same amount went out again with the chunk's next gradient.
SWAP_REGRESSIONS = (100740, 100776)
SWAP_KINDS = ("swap", "storm", "pause")
# Seed 100740 shrunk to one call and two swaps (partial q2, then async).
SHRUNK_100740 = (
    '{"seed":100740,"workers":6,"slots":6,"slot_base":31,"sizes":[65,65],"calls":1,"mode":1,'
    '"quorum":0,"up":{"loss":0.05776989713602161,"dup":0.014681701422605288,'
    '"delay":0.0010065781209778325,"jitter":0.005,"fifo":false},"down":{"loss":'
    '0.1614008376906383,"dup":0.0039135303427524915,"delay":0.0002481660579908299,'
    '"jitter":0.005,"fifo":true},"compute":0.002,"faults":[{"at":0.06588967042755442,'
    '"kind":"swap","mode":1,"quorum":2,"worker":0,"length":0.0},{"at":0.07588967042755441,'
    '"kind":"swap","mode":2,"quorum":0,"worker":0,"length":0.0}],'
    '"faults_end":1.133139301659321,"lossy_until":0.4049803350162501}')


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", SWAP_REGRESSIONS)
def test_swap_regressions(seed: int, target: str) -> None:
    _run(draw(seed, SWAP_KINDS), target)


@pytest.mark.parametrize("target", ["native", "python"])
def test_round0_ack_after_swap_to_async(target: str) -> None:
    _run(Plan.from_json(SHRUNK_100740), target)


# Seeds that once hung or went over the liveness bound after swaps (kinds swap, storm, pause).
# 100545: after one swap async -> sync with a lossy way down, a JOIN sent at the round number
# of the slot's last async round (whose result, for an earlier contribution of the same chunk,
# was lost) met that round's RESEND with the sender's bit and other lanes, for ever.
# 100648: two members paused across a storm that ended in sync left one of them a call behind
# the others' rounds; each of its slots realigned one round per join_after (a call took 11 s
# after the faults stopped) while its own chunks waited for rounds of their own.
# 100282: into a silent switch one packet per RTO probes; the probe went to whichever timer
# fired, always the same slot's, and a member's contribution lost on another slot never went
# out again: its sync round waited until the member's call failed by dead_after.
LIVENESS_REGRESSIONS = (100282, 100545, 100648)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", LIVENESS_REGRESSIONS)
def test_swap_liveness_regressions(seed: int, target: str) -> None:
    _run(draw(seed, SWAP_KINDS), target)


# Seeds of long sweeps (every fault kind). 650081, 636429: a sync-style retransmission that
# the switch had answered with a RESEND without the sender's bit met the slot after a swap
# into async and was refused (§4 step 8): STALE_ROUND for a round just behind the switch's,
# which the worker took for a restart. 522472: a member died in sync; the survivors' calls
# failed by dead_after counted from the last result they heard, past a bound the checker
# counted from the last fault. 1014792 (one swap async -> sync, members four calls apart),
# 590866 (resets aborted calls at different points): in sync, a member's own chunk that met a
# round of another chunk waited for a round of its own, which came only when the others came
# back to its key; a call took over 6 s.
SWEEP_REGRESSIONS = (522472, 590866, 636429, 650081, 1014792)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", SWEEP_REGRESSIONS)
def test_sweep_regressions(seed: int, target: str) -> None:
    _run(draw(seed), target)


# Seeds of a slow switch (0.5-1 s to reach the pipeline) whose calls failed by dead_after with
# the switch answering all along: the RTO, capped below the round trip, retransmitted before
# every answer came back, so each "not counted" answered an earlier transmission and the echo
# rule ignored it. The engine's timing is now fitted to the switch (Plan.rto_max, dead_after;
# docs/protocol.md §9, "Timing"). 9000480: no other fault; 9001034: and a restart.
SLOW_SWITCH_REGRESSIONS = (9000480, 9001034)


@pytest.mark.parametrize("target", ["native", "python", "tna-model"])
@pytest.mark.parametrize("seed", SLOW_SWITCH_REGRESSIONS)
def test_slow_switch_regressions(seed: int, target: str) -> None:
    _run(draw(seed), target)


# Seeds of the 9,000,000 sweep, each fixed at its cause (docs/protocol.md §10):
# 9000578, 9000594 (a member's call gave 1e30 while its last packet was still out; the value
# stayed in its residual, to be sent as the sentinel by the chunk's next contribution) - the
# checker now counts a residual element beyond the quantizer's range as a sentinel held.
# 9002414 (a member died after its contributions were counted in rounds that a paused peer
# closed later; each result restarted the survivors' dead timer) - rule dead_member's bound
# starts at the last result of a round the dead member had joined.
# 9000815, 9002514 (a JOIN of zeros joined a sync round that waited for a dead member and
# held its slot; the call's own chunk queued behind it was never launched, async results on
# the other slots kept the dead timer quiet, and the call outlived the liveness bound) - the
# packet deadline covers a packet that holds a slot a chunk of the call waits for.
# 9003263, 9003280 (a RESYNC answered with a contribution, then, at the same simulated
# instant, a reply that showed a new switch state aborted the call and forgot that packet,
# which the switch then counted), 9003430 (between calls, a result of a new switch state
# dropped the parked packet, and the result that counted it, read at the same instant, came
# after) - the checker orders sends, aborts and acknowledgements of one instant as they
# happened, so each packet is one whose fate the worker could not know (unknown_fate).
# 9001471 (an ACK settled a parked contribution whose round's result every member lost, then
# a restart wiped the state after the owner's last call) - the time after the calls judges
# suspected rounds as poll_results does, so the owner's replica is flagged.
SWEEP_9M_REGRESSIONS = (9000578, 9000594, 9002414, 9000815, 9002514, 9003263, 9003280,
                        9003430, 9001471)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", SWEEP_9M_REGRESSIONS)
def test_sweep_9m_regressions(seed: int, target: str) -> None:
    _run(draw(seed), target)


# Seeds of the 100,000-seed sweep from 9000000 (docs/protocol.md §10).
# 9019369, 9000692 (an aborted call's packet counted in an open round; the next call's probe
# was refused with the member's bit in that round, which replaced the round's record in the
# member cell; its relaunch, held behind the forgotten packet, was counted in async once the
# slot turned, and its ACK was taken for the forgotten packet's record: counted twice) - a
# flight refused so no longer takes that answer for another contribution's.
# 9000279 (the same, with the forgotten packet of the probe's own chunk: the refusal mark,
# written over the forgotten packet's record, is what makes the relaunch's ACK its own)
# 9036984 (a partial round counted a member's contribution and its RESULT was lost to it; a
# re-install's two STALE answers to the retransmissions were lost too, and the third came
# after a swap to async: its open round, behind the flight's, now shows the state new - the
# flight is carried with the replica flagged, not carried as if the old state never counted it)
# 9045913 (behind a switch 0.96 s slow, a member's first-contact probe was lost at the first
# transmission whose back-off outgrew the round trip; its retransmission, due one silence
# period after that probe, read the period as not yet over (a difference rounded below it) and
# waited rto_max more, so the probe met its packet deadline and every member's call, waiting on
# its sync round, failed 'unreachable') - the period is tested as its timers are armed
# 9044368 (a restart's new state counted a member's chunk 1 in round 1 after a reply of that
# state aborted its call; the next call's chunk 15, sent at round 1, was dropped there as the
# member's duplicate, the round's RESULT was lost to it, and its retransmission's STALE_COUNTED,
# the forgotten packet's count, settled it as counted: lost) - a flight sent at the round of a
# packet of another chunk that the last abort forgot takes such an answer for "not counted"
# 9079057 (a member's parked chunk 5 of round 2 was counted when it reached the slot after a
# swap into async; another member's async RESULT, reporting the swap first, had it sent again
# at once; its own RESULT settled it, and the next chunk went out under a sequence number, which
# the out-of-order uplink delivered ahead of the copy: the copy's round field was not behind
# it, and it was counted again) - a parked packet is not sent again at once into an async slot
# 9039175 (a member lost the RESULT of a peer's async round 45 on a slot, and after a swap to
# sync JOINed it; the JOIN, lost once, went out again 1.26 s later and met round 45's RESEND
# without its bit; carried, it was not offered at the open round 46, a sync round waiting for
# it, until its next call's join_after, and a peer's packet there met its deadline) - a JOIN
# answered by a RESEND of the round it named is offered at the slot's next round at once,
# whether that round closed with its place or without it
# 9061566 (after a restart a member a call behind, its chunks of key 1 counted in the new
# state's rounds 0, left sync rounds 1 of slots 40 and 41 lacking only it; in its next call,
# of key 0, whose one chunk is on slot 39, the RESULT of a displaced chunk its previous call
# had chased there at its end put off the JOIN of the idle slots 40 and 41 by a second, past
# the peers' packet deadline there) - a displaced chunk an earlier call chased is not the
# call's progress for join_after
# 9068240 (a member's call given up at 3.110 s on its packet deadline: a sync round of slot 29
# waited for a straggler whose replies the lossy downlink lost; its next call, of a one-chunk
# key, parked that chunk in a partial round 44 ms later, 93 ms after the switch last answered,
# and was failed 'unreachable' as if the switch had been silent since the give-up) - after a
# packet deadline's give-up a call that ends by parking is unreachable only once the switch has
# been unheard for dead_after
# 9010355 (a member's JOIN, sent on slot 20 by its stuck call, was answered in its next call
# by a RESEND with its bit on another chunk; offered at once at slot 20's next round, a round of
# peers a call ahead, it was held there a second, and its RESULT, taken for the call's progress,
# put off the call's JOIN of slot 21, whose round lacked only it, past a peer's packet deadline)
# - a JOIN behind the slot is offered again at once only for the call that sent it
# 9075276 (behind a switch 0.56 s slow, a member a call behind, its call of key 1 waiting on
# slot 61, had its JOINs of four idle slots answered by RESENDs with its bit on another chunk;
# each, offered at once at the slot's next round, where no round was open yet, was refused
# NOT_JOINED a round trip later, and each refusal, taken for the call's progress, put off its
# JOIN of slot 55, whose sync round 1 lacked only it, past the peers' packet deadline) - a JOIN
# offered at once and refused is not the call's progress
# 9078748 (a member learned slot 4's round 2 from a RESYNC of a state whose results it lost
# and never heard the restart after it; it learned the next state's tag from that state's first
# result and applied its round 0 on slot 4, then sent round 2 and met open round 1: a reset
# shown by a RESYNC, which left the tag known - the state that answered. Heard again past the
# late window, the tag was learned anew, and the RESEND of round 0 that the member's JOIN met
# was applied a second time) - a result of the tag left, of a round seen under it, is a
# duplicate
# 9105650 (in partial rounds of quorum 1, a member paused 0.35 s as its call began while its peers
# finished the job; the answer it read at the pause's end gave its RTO 0.40 s, and its next
# contribution met a STALE_ROUND naming a sync round, whose grace, one RTO, fell due in its
# second pause, begun 0.22 s later; the flight went out again, and its deadline started, at
# that pause's end, and the call failed 'unreachable' 0.084 s past the bound counted from the
# STALE reply) - not a worker bug: a pause begun within one back-off of such a reply, before
# the flight went out again, counts from its end (the checker's bound)
# 9102569 (a one-element key of -inf: every call's packet alike. A member's sync-style packet of
# round 2, sent again after a swap into async, was counted in async round 2 and ACKed; its next
# call's packet, of the same chunk and lanes, was lost, and round 2's RESULT, with the member's
# bit and those lanes, was taken for that packet counted below its floor, round 3: the call
# ended 'reset' on no restart, and the lost packet was settled as counted) - an ACKed
# sync-style packet leaves a twin, whose result settles no flight
# 9102095 (a member's chunk 1, parked on slot 8 while the slot ran partial, was relaunched at
# sync round 4 after a swap, a round latched with a member who had died; the reply that reported
# the slot sync put the call's chunk 7 back in the queue behind it, and the packet deadline
# skipped the parked packet, so async results on other slots kept the call alive until 24.4 s)
# - a parked packet that a chunk of the call waits behind meets the packet deadline
# 9086527 (behind a switch 0.33 s slow, the first contact's timeouts left the members' RTO at
# 0.32 s with no RTT sample; a partial packet met silence for the round trip, was parked at its
# first timeout, and the RESULT answered the park's copy - no sample, and the park left the RTO
# as it was - so members 0 and 2 parked every call's packet on slot 31 before its answer and
# carried the chunks behind it, and member 0's chunk 24 of key 1 reached no round in three
# calls) - before any RTT sample a park at a timeout backs the RTO off
# 9109296 (a member paused through two restarts read at once a STALE_COUNTED's grace period
# run out on slot 16, for round 4 of the state before them, and the first results of the
# newest state; its call's timers ran before the call aborted, and the STALE_COUNTED taught
# slot 16 round 5 in the new state. Its next JOIN there met open round 1, a false reset shown
# by a RESYNC; past the late window the state's tag was learned anew, and the RESEND of slot
# 18 round 0 that a JOIN met was applied a second time) - a STALE_COUNTED of the state a
# reset left teaches the new state no round
# 9081944 (a member's chunk 2, sent at slot 34's round 17 while the slot reported partial, was
# parked; its next call's start sent it again at once, the member not yet told of the swap
# into async, and the RESULT of an earlier copy, counted in an async round, launched the
# call's chunk 2 under a sequence number at once; the uplink out of order, the hurried copy
# met the slot behind it, its round field not behind that number, and was counted again) - a
# slot reported async sends a contribution under a sequence number only once the last copy of
# the sync-style packet before it, if sent more than once, is one RTO old
# 9125740 (partial rounds of quorum 5 that waited for slow calls put the RTO at 0.43-0.5 s,
# none of it backed off, on a path of ~2 ms; in a swap storm five slots turned async held their
# contributions behind a retransmitted sync-style copy 0.29-0.49 s, a call stalled half a
# second, and on the schedule that left, in partial after the storm, worker 2's chunks 0 and 12
# reached no round in its last three calls) - that wait is one RTO of the path, learned from
# answers the switch sent as my packet arrived
# 9132941 (behind a switch 0.84 s slow, worker 0's call 4, one call behind its peers, launched
# chunk 2 on slot 51 at 10.426 s into a round they had left; their last round with it closed at
# 12.963 s, and their JOINs closed slot 51's round at 15.65 s, after the packet deadline counted
# from launch, 15.112 s: the call failed 'unreachable' with every member alive) - the packet
# deadline counts from the last RESULT heard whose bitmap holds every member, if later
# 10001822 (a restart at 0.3203 s and a re-install at 0.3232 s, tags 29, 130, 149: member 3
# learned tag 149 at 0.324497 s and applied its slot 41 round 0 and slot 42 round 1; a result
# of tag 29, late, arrived 0.324652 s: neither known nor the tag left, it was taken for a
# third state, a late one of tag 130 for a fourth, then tag 149's copies of those two rounds,
# at 0.32738 s and 0.32845 s, for a fifth, and applied a second time; member 5, paused through
# both, did the same with tag 130's slot 42 round 0) - every tag left within two rto_max of
# when it was left is told late, not the last one only
# 10003598 (a partial call sent a staler chunk first on a slot, parked it in a round held for
# others and carried the fresher chunk 1 behind it; chunk 1 met the members out of step in the
# two calls after) - the check reads that call as the staler chunk's turn
# 10055420 (a retransmission into an old round answered with its stored RESULT of every member,
# a RESEND, moved the packet deadline of a call stuck on sync rounds past the liveness bound) -
# a RESEND does not move it
SWEEP_100K_REGRESSIONS = (9019369, 9000692, 9000279, 9036984, 9045913, 9044368, 9079057, 9039175,
                          9061566, 9068240, 9010355, 9075276, 9078748, 9105650, 9102569, 9102095,
                          9086527, 9109296, 9081944, 9127363, 9125740, 9110370, 9132941,
                          10001822, 10003598, 10055420, 10036437)

# Seeds the sweep's continuation from 9052000 found on the engine before the partial re-offer,
# the held slot's wait and the probe period as armed: starvation 9053103, 9057068 (clean once
# displaced chunks are offered again), 9078446, 9078861 (clean with the held slot's wait as
# well), and calls failed 'unreachable' 9068527, 9081534 (clean with the probe period as
# armed). Each was replayed, not traced: they hold on the engine's own schedule.
SWEEP_CONTINUATION_REGRESSIONS = (9053103, 9057068, 9078446, 9078861, 9068527, 9081534)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", SWEEP_CONTINUATION_REGRESSIONS)
def test_sweep_continuation_regressions(seed: int, target: str) -> None:
    _run(draw(seed), target)


@pytest.mark.parametrize("target", ["native", "python"])
@pytest.mark.parametrize("seed", SWEEP_100K_REGRESSIONS)
def test_sweep_100k_regressions(seed: int, target: str) -> None:
    _run(draw(seed), target)


# Seeds of a switch slower than the workers' compute in partial mode: a call carried its chunks
# behind the slot's parked packet after one RTO, so every call sent the same first chunk of each
# slot and the chunks behind it reached no round (starvation). A partial call now sends a slot's
# chunks least recently closed first, in the order their results were applied
# (docs/protocol.md §9, "Sync / partial sending", bounded staleness). 9000423, 9002095,
# 9002259: a slow switch and swaps; 9001676: and resets with async reordering.
SLOW_PARTIAL_REGRESSIONS = (9000423, 9002095, 9002259, 9001676)


@pytest.mark.parametrize("target", ["native", "python", "tna-model"])
@pytest.mark.parametrize("seed", SLOW_PARTIAL_REGRESSIONS)
def test_slow_partial_regressions(seed: int, target: str) -> None:
    _run(draw(seed), target)


# Seeds of the TNA model's sweeps within the Tofino program's fault model (plan.TOFINO) that
# violated on tna-model only. 9009951 (starvation): eight members in partial rounds needing
# all; a wait of 0.33 s in a round held for the others, taken for member 5's first RTT sample,
# pinned its RTO at rto_max, and at 3.39 s its packet that the early look could not park
# waited out that RTO (0.23 s), its call of key 2 ending 0.3 s behind the others'; their
# rounds on two slots waited for it, members 3 and 7 found those slots held in two calls of
# key 2, and in the one call left their chunks 14, 21, 26 and 27 met the others out of step.
# A partial RESULT that another member's contribution closed gives no RTT sample now
# (Faults::held_result_samples_rtt).
TNA_PARTIAL_REGRESSIONS = (9009951,)


@pytest.mark.parametrize("target", ["native", "python", "tna-model"])
@pytest.mark.parametrize("seed", TNA_PARTIAL_REGRESSIONS)
def test_tna_partial_regressions(seed: int, target: str) -> None:
    _run(draw(seed, model=TOFINO), target)


def test_a_straggler_that_loss_held_back_is_counted() -> None:
    """Seed 300033: the network's loss held a live member back; its peers' calls failed by
    dead_after while it caught up. Allowed, and counted (docs/protocol.md §10, rule
    "lossy_straggler")."""
    rec, sim = simulate(draw(300033), "native")
    assert not check(rec, sim)
    assert rec.excused.get("lossy_straggler", 0) > 0


def test_a_probe_copy_that_erased_its_relaunch_count_is_a_limit() -> None:
    """Seed 9027365: the network's copy of a member's first-contact probe (a sequence number)
    reached the slot after the probe's relaunch was counted in the open round; its refusal
    mark replaced that count's record in the member cell, the round's RESULT was lost to the
    member, and its retransmission, stale by then, was told STALE_ROUND: carried, counted
    twice. The switch cannot tell that copy from a newer contribution beside a packet an
    aborted call forgot (seed 9000279), so it is the limit "limit_stale_copy"
    (docs/protocol.md §10); without its evidence, the books are reported."""
    rec, sim = simulate(draw(9027365), "native")
    assert not check(rec, sim)
    assert rec.excused.get("limit_stale_copy", 0) > 0
    rec.erased.clear()
    rec.excused.clear()
    assert any(v.startswith("exactly-once: worker 0 chunk 0") for v in check(rec, sim))


def test_a_probe_whose_answers_loss_held_back_is_counted() -> None:
    """Seed 9019887: behind a slow switch (44x the compute step) on a lossy network, a member's
    first-contact probe had the STALE replies naming the open round lost twice in a row; its
    silent window sent the probe again seconds later, and the calls of every member, waiting
    on its round, failed by dead_after. Allowed by rule "lossy_straggler" (its downstream
    case, docs/protocol.md §10); without that evidence, the same failures are reported.
    Replayed on the schedule it was found on (plan.PROBE_PERIOD_AS_FOUND, and the packet
    deadline counted from launch only, Faults::flight_deadline_from_launch): on the engine's
    own the probe goes out a period sooner, the deadline counts from the last RESULT of every
    member, and the seed passes without the rule."""
    rec, sim = simulate(draw(9019887), "native",
                        faults={**PROBE_PERIOD_AS_FOUND, "flight_deadline_from_launch": True})
    assert not check(rec, sim)
    assert rec.excused.get("lossy_straggler", 0) > 0
    rec.answer_loss_streaks.clear()
    rec.excused.clear()
    assert any(v.startswith("failure:") and "'unreachable'" in v for v in check(rec, sim))
    rec, sim = simulate(draw(9019887), "native")
    assert not check(rec, sim)


@pytest.mark.parametrize("target", ["native", "python", "tna-model"])
def test_a_call_whose_own_contribution_loss_held_back_is_counted(target: str) -> None:
    """Seed 9005694 on the Tofino fault model: behind a switch 0.54 s slow, in async, a
    member's chunk 1 was lost at its first transmission and again at its first probe 1.7 s
    later (the silent window probed its other slot first); the next probe, a window of two
    probe periods on, came after its packet deadline, and the call failed 'unreachable' with
    its peers several calls ahead. Allowed by rule "lossy_straggler" (its own contribution's
    case, docs/protocol.md §10); without those losses in a row of that member on that slot,
    the failure is reported."""
    rec, sim = simulate(draw(9005694, model=TOFINO), target)
    assert not check(rec, sim)
    assert rec.excused.get("lossy_straggler", 0) > 0
    rec.loss_streaks[:] = [s for s in rec.loss_streaks if s[1:] != (5, 41)]
    rec.excused.clear()
    assert any(v.startswith("failure: worker 5 call 3") and "'unreachable'" in v
               for v in check(rec, sim))


# Replayed on the schedule they were found on, before a call waited one RTO for a held slot's
# answer (Faults::carry_held_at_start) and before a partial RESULT closed by another member's
# contribution gave no RTT sample (plan.HELD_RESULT_AS_FOUND): on the engine's own neither
# meets the situation.
OWN_COUNT_MISREAD = ((9000006, "worker 6 chunk 0"), (9000923, "worker 1 chunk 6"))


@pytest.mark.parametrize(("seed", "books"), OWN_COUNT_MISREAD)
def test_an_own_count_taken_for_a_forgotten_packets_is_an_unknown_fate(seed: int,
                                                                       books: str) -> None:
    """A member's call forgot a packet at a round (its abort dropped it); the next call's chunk,
    sent at that round, was counted there, and the ACK or STALE_COUNTED of that count was taken
    for the forgotten packet's record ("not counted", §9 "Sync / partial sending"): counted
    twice, with the replica flagged. Allowed as an unknown fate (docs/protocol.md §10);
    without the engine's record of that misread answer it is reported."""
    found_on = {"carry_held_at_start": True, **HELD_RESULT_AS_FOUND}
    rec, sim = simulate(draw(seed), "native", faults=found_on)
    assert not check(rec, sim)
    assert any(wk.misread_own for wk in sim.workers)
    for wk in sim.workers:
        wk.misread_own.clear()
    assert any(v.startswith(f"exactly-once: {books} ") for v in check(rec, sim))
    rec, sim = simulate(draw(seed), "native")
    assert not check(rec, sim)


def test_a_call_that_never_heard_of_a_new_state_may_fail_unreachable() -> None:
    """Seed 9026054: a member's RESULT was lost, a restart and then a re-install wiped the
    state, and its retransmissions opened the new states' round of a chunk its peers had left
    behind; held there without a word (its JOINs met NOT_JOINED), it never learned of the new
    state, and its call failed by dead_after before the peers' JOINs closed the round. Allowed
    by rule "restart_unheard" (docs/protocol.md §10); had it heard any other reply after each
    restart and re-install, the failure is reported. Replayed on the schedule it was found on
    (plan.PROBE_PERIOD_AS_FOUND): on the engine's own the seed passes without the rule."""
    rec, sim = simulate(draw(9026054), "native", faults=PROBE_PERIOD_AS_FOUND)
    assert not check(rec, sim)
    assert rec.excused.get("restart_unheard", 0) > 0
    for wk in sim.workers:
        wk.answers_heard += [f.at + 0.001 for f in rec.plan.faults
                             if f.kind in ("restart", "readd")]
    rec.excused.clear()
    assert any(v.startswith("failure:") and "'unreachable'" in v for v in check(rec, sim))
    rec, sim = simulate(draw(9026054), "native")
    assert not check(rec, sim)


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_pause_begun_before_the_dead_timer_started_counts_from_its_end(target: str) -> None:
    """Seed 9080965: member 2's chunks 0 and 1, sent at round 42 of slots 20 and 21 while they
    reported partial, were lost and parked at 0.118 s; async RESULTs of round 42 without its
    bit then reported the slots async, where a parked packet is not sent again at once, so
    their timers fell due rto_max after parking, at 0.619 s. A bare restart came at 0.271 s
    and member 2's pauses at 0.433 s and 0.603 s (to 1.337 s), its dead timer not yet started
    (nothing sent since its last reply, 0.139 s): the call gave up dead_after after its packets
    sent at the pause's end, at 4.337 s, 0.066 s past the bound counted from the restart.
    Allowed by rule "bare_unreachable" counted from the pause's end (docs/protocol.md §10);
    had the member sent a packet between its last reply and the pause, its timer ran from
    then, and had the pauses begun more than one back-off (rto_max) after the restart, the
    member was silent longer than its timers allow: either way the failure is reported.
    Replayed on the schedule it was found on, before the packet deadline reached a parked
    packet that a chunk of the call waits behind (Faults::parked_flight_no_deadline): on the
    engine's own the call fails at 3.135 s, dead_after after the first of those RESULTs put
    the call's chunks of slot 21 back in the queue behind its parked packet, within the bound
    from the restart (the seed passes there too)."""
    rec, sim = simulate(draw(9080965), target)
    assert not check(rec, sim)
    rec, sim = simulate(draw(9080965), target, faults={"parked_flight_no_deadline": True})
    assert not check(rec, sim)
    assert rec.excused.get("bare_unreachable", 0) > 0
    plan = rec.plan
    restart = next(t for t, kind in rec.resets if kind == "restart_bare")
    rec.plan = dataclasses.replace(plan, faults=tuple(
        dataclasses.replace(f, at=max(f.at, restart + plan.rto_max + 0.01))
        if f.kind == "pause" and f.worker == 2 else f for f in plan.faults))
    rec.excused.clear()
    assert any(v.startswith("failure: worker 2 call 3") and "'unreachable'" in v
               for v in check(rec, sim))
    rec.plan = plan
    wk = sim.workers[2]
    wk.sent.append((restart + 0.01, rec.plan.slot_base, 0))
    wk.sent.sort()
    rec.excused.clear()
    assert any(v.startswith("failure: worker 2 call 3") and "'unreachable'" in v
               for v in check(rec, sim))


@pytest.mark.parametrize("target", ["native", "python"])
def test_a_pause_begun_in_a_stale_replys_grace_counts_from_its_end(target: str) -> None:
    """Seed 9105650: member 2, paused from 0.143 s to 0.497 s as its call 30 began, its peers
    finishing the job meanwhile, read at the pause's end an answer to a packet sent before
    it: its RTO rose to 0.40 s. Its next contribution met a STALE_ROUND naming the open round,
    now sync, at 0.499 s; the flight's grace, one RTO, fell due in its pause from 0.720 s to
    1.583 s, and the flight went out again, its deadline starting, at the pause's end: the call
    failed at 4.583 s, past the bound counted from the STALE reply. Allowed by rule
    "end_behind" counted from the pause's end (docs/protocol.md §10); had the pause begun more
    than one back-off (rto_max) after the reply, or had the member sent a packet between the
    reply and the pause, the failure is reported."""
    rec, sim = simulate(draw(9105650), target)
    assert not check(rec, sim)
    assert rec.excused.get("end_behind", 0) > 0
    plan = rec.plan
    wk = sim.workers[2]
    stale = max(t for t in wk.stales_heard if t < 0.72)
    rec.plan = dataclasses.replace(plan, faults=tuple(
        dataclasses.replace(f, at=stale + plan.rto_max + 0.01)
        if f.kind == "pause" and f.worker == 2 and f.at > stale else f
        for f in plan.faults))
    rec.excused.clear()
    assert any(v.startswith("failure: worker 2 call 30") and "'unreachable'" in v
               for v in check(rec, sim))
    rec.plan = plan
    wk.sent.append((stale + 0.01, plan.slot_base, 0))
    wk.sent.sort()
    rec.excused.clear()
    assert any(v.startswith("failure: worker 2 call 30") and "'unreachable'" in v
               for v in check(rec, sim))


# Seeds of the 9,000,000 sweep whose network duplicated a member's async contribution and
# delivered the copy behind the member's next contribution on that slot: the copy met another
# sequence number in the member cell and was counted a second time, until the async window
# (docs/protocol.md §4 step 10) refused a number behind the one counted last.
ASYNC_REORDER_REGRESSIONS = (9000372, 9000391, 9001354, 9002232, 9002614)


@pytest.mark.parametrize("target", ["native", "python", "tna-model"])
@pytest.mark.parametrize("seed", ASYNC_REORDER_REGRESSIONS)
def test_async_reorder_regressions(seed: int, target: str) -> None:
    _run(draw(seed), target)


# 303058 on tna-model: w2's async sequence number 1 was recorded in member_seq, and its sync
# contribution to round 1, opening that round, read as counted (docs/tofino.md, difference 4).
# The TNA verdict rows, generated on the assumption that nobody is counted in a round nobody
# joined, made it a duplicate that closed round 1 with nothing counted.
TNA_REGRESSIONS = (303058,)


@pytest.mark.parametrize("seed", TNA_REGRESSIONS)
def test_tna_regressions(seed: int) -> None:
    _run(draw(seed), "tna-model")


# Seeds of the 9,000,000 sweep on tna-model within the Tofino program's fault model
# (plan.TOFINO): a member died while a sync round it had not joined was latched on a slot,
# and the live members' chunks there reached no round (the limit "A partial round latched
# with a member who then died", docs/protocol.md §10). On the TNA model the members' next
# chunk at that round meets CHUNK_MISMATCH and is carried, so their calls end where on
# v1model they fail by dead_after (docs/tofino.md, difference 5), and invariant 6 judges
# them; the rule reads the TNA model's registers now.
TNA_DEAD_LATCH = (9001169, 9001372, 9001524)


@pytest.mark.parametrize("seed", TNA_DEAD_LATCH)
def test_tna_dead_latch(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = draw(seed, model=TOFINO)
    rec, sim = simulate(plan, "tna-model")
    assert not check(rec, sim)
    assert rec.excused.get("limit_dead_latch", 0) > 0
    # Without the TNA model's open round read, the rule has no evidence: starvation.
    monkeypatch.setattr(TnaModelPipeline, "open_round", lambda *_args: None)
    rec.excused.clear()
    assert any(v.startswith("starvation") for v in check(rec, sim))


# Seeds of the 9,000,000 sweep on tna-model within the Tofino program's fault model: after a
# restart or a re-install a member's aborted call forgot a packet that the new state counted
# in an open round; the next call's probe was answered STALE_ROUND with the member's bit in
# that round, and its relaunch there (a duplicate, or of another chunk) went unanswered: the
# round's RESULT was lost, and the retransmission met the slot rounds later. The TNA
# program's member_seq keeps no refusal mark, so it still said "counted" (STALE_COUNTED) for
# the forgotten packet's count, and the flight was settled as counted (9005242: of the same
# chunk; 9005174, 9006326: of another chunk, where the worker takes the refusal for a mark
# that replaced the other packet's record, as on v1model). The limit "A relaunch meets its
# forgotten copy" (docs/protocol.md §10, limit_relaunch; docs/tofino.md, difference 14).
# Replayed on the schedule they were found on (plan.PROBE_PERIOD_AS_FOUND; on the engine's own,
# 9006326 no longer meets the situation; found, too, before a JOIN answered by a RESEND without
# its bit went at once to the slot's next round, Faults::join_left_out_waits, which moves
# 9006326's schedule, and before a partial packet parked at its first timeout with no RTT
# sample yet backed the RTO off, Faults::park_keeps_unlearned_rto, which moves 9005242's and
# 9006326's, and before a partial RESULT closed by another member's contribution gave no RTT
# sample, plan.HELD_RESULT_AS_FOUND, which moves them too, and before a flight whose round
# closed with my bit on another chunk was sent again at once, Faults::closed_by_my_other_waits_
# rto, seed 10036437's rule, which moves 9006326's) and must pass on the engine's own as well.
TNA_STALE_COUNTED_RELAUNCH = (9005174, 9005242, 9006326)
TNA_STALE_COUNTED_FOUND_ON = {**PROBE_PERIOD_AS_FOUND, "join_left_out_waits": True,
                              "park_keeps_unlearned_rto": True, **HELD_RESULT_AS_FOUND,
                              "closed_by_my_other_waits_rto": True}


class _Forgetful(dict):
    """A dict that keeps nothing: a Sim's record of the TNA model's STALE_COUNTED replies."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


@pytest.mark.parametrize("seed", TNA_STALE_COUNTED_RELAUNCH)
def test_tna_relaunch_settled_by_stale_counted(seed: int) -> None:
    plan = draw(seed, model=TOFINO)
    rec, sim = simulate(plan, "tna-model", faults=TNA_STALE_COUNTED_FOUND_ON)
    assert not check(rec, sim)
    assert rec.excused.get("limit_relaunch", 0) > 0
    # Without the STALE_COUNTED settlements as the limit's evidence: the books are reported.
    sim = Sim(plan, "tna-model", faults=TNA_STALE_COUNTED_FOUND_ON)
    sim.stale_counted_of = _Forgetful()
    rec = sim.run()
    assert any(v.startswith("exactly-once") for v in check(rec, sim))
    _run(plan, "tna-model")
