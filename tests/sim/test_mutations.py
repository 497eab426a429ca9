"""The checker catches each rule's violation when that rule's fix is taken out.

Each row takes one fix out - a field of the engine's `Faults` (native/worker/faults.h, the
simulation's only), a `join_after`
longer than any run, an engine given no install tag at attach, or a pipeline without the
install epoch - and replays a seed (or a stored plan, tests/sim/plans/) where the
checker then reports the rule the fix keeps (docs/protocol.md §10, "Allowed, by rule" and
the invariants); with the fix in, the same seed passes. The seeds were found by running the
fault kinds of the row from its first seed until one failed with the fix out and passed
with it in; a change to the engine's timers or the plans' draw calls for new ones
(`python -m tests.sim --seeds 40 --start <first seed> --kinds <kinds>` with the knob set
in a replay shows where). tests/sim/test_races.py holds the races found before these rules
(the install tag, the refusal and JOIN marks, the chase, the sentinel).

Rows found before a call waited one RTO for the answer of a parked packet that held its slot
when that packet's timer had fallen due between calls (Flights::start_call) replay the
schedule they were found on: they take that wait out too (`CARRY_HELD_AT_START`), since it
shifts their schedules and none meets its case then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .check import check
from .plan import (
    DEAD_AFTER,
    FAULT_KINDS,
    HELD_RESULT_AS_FOUND,
    HOST_KINDS,
    HOSTS_DRAWN,
    PROBE_PERIOD_AS_FOUND,
    RTO_MAX,
    TOFINO,
    Plan,
    draw,
)
from .run import simulate
from .test_races import NoEpochPipeline

# A call's chunks on a slot held by a parked packet whose timer fell due between calls are
# carried at once, as before the wait of one RTO for its answer (Faults::carry_held_at_start).
CARRY_HELD_AT_START = {"carry_held_at_start": True}

# name: (fault kinds, seed, what takes the fix out, the invariant the checker must report,
# text its report must hold)
MUTATIONS: dict[str, tuple[tuple[str, ...], int, dict[str, Any], str, str]] = {
    # §9 "Swap storms", rule 2: a stray reply settles a flight; the worker then takes a
    # round behind its own for a new switch state and aborts with no restart at all.
    "echo": (("storm",), 20000, {"faults": {"ignore_echo": True}}, "failure",
             "'reset'"),
    # §9 "Swap storms", rule 1: rounds wait for members done with their chunk; calls fail
    # by dead_after with nobody gone.
    "join": (("swap", "storm"), 30013, {"engine": {"join_after": 1e9}}, "failure",
             "'unreachable'"),
    # §4 step 8: a re-added job inherits its slots' rounds; rounds close with contributions
    # the switch never counted in them.
    "install_epoch": (("readd",), 40003, {"make_pipeline": NoEpochPipeline}, "exactly-once",
                      "closed with bitmap"),
    # §9 "A switch that lost the job's state": without acting on a new state, workers send
    # rounds the new state answers STALE until dead_after.
    "restart_detection": (("restart", "readd"), 60001,
                          {"faults": {"no_restart_detection": True}}, "failure",
                          "'unreachable'"),
    # §9 Failures, the packet's deadline: a round latched in sync waits for a dead member
    # while other slots' replies keep the call alive past every bound.
    "flight_deadline": (("death", "storm"), 70002,
                        {"faults": {"no_flight_deadline": True}}, "failure",
                        "'unreachable'"),
    # §9 Failures, the packet's deadline: a JOIN of zeros joined a sync round that waits for
    # a dead member and holds the slot a chunk of the call waits for; async results on other
    # slots keep the dead timer quiet.
    "blocking_flight_deadline": (FAULT_KINDS, 9000815, {"faults": {"own_flight_deadline": True}},
                                 "liveness", "null chunk 1"),
    # §9 "A switch that lost the job's state": an abort sends what it had queued for the
    # flights it forgot; the new state counts what the residual keeps.
    "abort_discards_unsent": (("restart", "readd", "swap"), 80338,
                              {"faults": {"send_dropped": True, **CARRY_HELD_AT_START}},
                              "exactly-once", "worker 2 chunk 9"),
    # §9 "Timing": an engine whose RTO is capped below a slow switch's round trip never hears
    # the answer to its latest transmission; calls fail by dead_after with nobody gone.
    "engine_timing": (("slow_switch",), 90003,
                      {"engine": {"rto_max": RTO_MAX, "dead_after": DEAD_AFTER}}, "failure",
                      "'unreachable'"),
    # §9 "A switch that lost the job's state", the install tag given at attach: a worker that
    # hears its first reply from the state after a re-install learns that state's tag as its
    # first, and the books of its contributions across the two states no longer balance,
    # with its replica not flagged.
    "install_tag_at_attach": (FAULT_KINDS, 9001487, {"engine": {"install_tag": -1}},
                              "exactly-once", "worker 2 chunk 1"),
    # §9 "A switch that lost the job's state", a late packet of the state left is told by when
    # it arrived: read after a long pause between calls, a copy of a result applied already
    # is taken for a newer state's and applied again. (The seed's worker meets that late
    # packet only on the path where the reply that showed the state new leaves its flight
    # unsettled: the settle is taken out with it, and alone, it passes; the rule's unit test
    # is tests/worker/test_install_tag.py.)
    "arrival_time_window": (FAULT_KINDS, 9003091,
                            {"faults": {"read_time_window": True,
                                        "forget_counted_at_reset": True}},
                            "agreement", "applied slot 12 round 0"),
    # §9 "A switch that lost the job's state": the result whose new tag shows the new state
    # counted my flight (partial, round 0 of a re-install); forgotten by the reset, its
    # amount stays in the residual and is counted again.
    "settle_at_new_tag": (FAULT_KINDS, 9000946, {"faults": {"forget_counted_at_reset": True}},
                          "exactly-once", "worker 1 chunk 0"),
    # §9 "Sync / partial sending", bounded staleness: behind a switch slower than the workers'
    # compute, every partial call sends the same first chunk of each slot and carries the
    # rest; the chunks behind it reach no round.
    "partial_rotation": (FAULT_KINDS, 9000423,
                         {"faults": {"fixed_order": True, **CARRY_HELD_AT_START}},
                         "starvation", "chunk(s) [12] of key 0"),
    # §9 "Sync / partial sending", bounded staleness: behind a slow switch a member's parked
    # chunk 2 of its last call closes round 3 after its call started; in the order drawn at
    # the start, the call sends chunk 2 again at round 4 and displaces the others' chunk 8,
    # at every call. (The others' displaced chunk 8, offered again once round 4 closes,
    # reaches a round too: the order shows alone with that re-offer taken out as well.)
    "partial_order_after_a_close": (FAULT_KINDS, 9024099,
                                    {"faults": {"order_at_start": True, "no_reoffer": True,
                                                **CARRY_HELD_AT_START}},
                                    "starvation", "chunk(s) [8, 12, 15] of key 0"),
    # §9 "Sync / partial sending", a displaced chunk offered again: two members half a call
    # apart on one slot of a key's chunks 0-2 behind a slow switch; each call's chunk 1 meets
    # the round the other opened with its last chunk, joins it and, carried to the key's next
    # call, meets the same there: chunk 1 reaches no round.
    "partial_reoffer": (FAULT_KINDS, 9019721, {"faults": {"no_reoffer": True}}, "starvation",
                        "chunk(s) [1] of key 0"),
    # §9 "Sync / partial sending", partial liveness: a call that starts on a slot held by a
    # parked packet waits one RTO for its answer. Run first, that packet's own timer, due
    # between calls, carried the call's chunks there at once: six members in two groups
    # behind a switch 0.52 s slow, partial with a quorum of all six; a member's call of key
    # 2, its one chunk's slot held, ended at its start, the member ran a call ahead of its
    # group, and in its last call of key 1 its chunks 36-39, third on their slots, met the
    # others' rounds of key 0 and reached no round.
    "partial_held_slot_waits": (FAULT_KINDS, 9061714, {"faults": {**CARRY_HELD_AT_START}},
                                "starvation", "chunk(s) [36, 37, 38, 39] of key 1"),
    # §9 RULE A: an ACK settles a parked partial contribution counted in a round of one whose
    # result every member lost; a restart then wipes the state. Left suspected, the round is
    # judged missed and the replica flagged; unsuspected, the gradient reached no replica and
    # nobody knows it.
    "ack_leaves_round_suspected": (FAULT_KINDS, 9001471,
                                   {"faults": {"ack_leaves_no_suspect": True}}, "exactly-once",
                                   "worker 1 chunk 0"),
    # §9 "Sync / partial sending", a forgotten copy's record replaced: after a re-add a call
    # aborts with its chunk 1 counted in an open round; the next call's probe of chunk 5 is
    # refused with its bit in that round (the refusal mark replaces the record), its relaunch
    # waits there behind the forgotten packet, and is counted in async once the slot turns.
    # Its ACK, taken for the forgotten packet's record, carries the amount: counted twice.
    "refused_mark": (FAULT_KINDS, 9019369, {"faults": {"refused_mark_unread": True}},
                     "exactly-once", "worker 1 chunk 5"),
    # §9 "A switch that lost the job's state", a STALE answer in async: a partial round
    # counted worker 0's chunk 0 and its RESULT was lost to it; a re-install answered the
    # retransmissions STALE at round 0, lost twice, and the third answer came after a swap to
    # async. Not read as a new state, the flight is carried as residual with the replica
    # unflagged: what the old state counted is counted twice.
    "async_answer_to_sync_flight": (FAULT_KINDS, 9036984,
                                    {"faults": {"async_answer_unread": True}},
                                    "exactly-once", "worker 0 chunk 0"),
    # §9 Failures, the silent window's probes: behind a switch 0.96 s slow a member's
    # first-contact probe is lost; its retransmission falls due one probe period after it,
    # the period read as a difference rounds below it, and the probe waits rto_max more:
    # it meets its packet deadline, and every member's call fails waiting on its sync round.
    "probe_period": (FAULT_KINDS, 9045913, {"faults": {"probe_period_by_difference": True}},
                     "failure", "worker 6 call 0"),
    # §9 "Sync / partial sending", a forgotten copy's round: a restart's new state counts a
    # member's chunk 1 in round 1 after a reply of that state aborted its call; the next
    # call's chunk 15, sent at round 1, is dropped there as its duplicate, the round's RESULT
    # is lost to it, and the STALE_COUNTED its retransmission meets, the forgotten packet's
    # count, settles chunk 15 as counted: its amount leaves the residual and reaches no round.
    "forgotten_round": (FAULT_KINDS, 9044368, {"faults": {"forgotten_round_unread": True}},
                        "exactly-once", "worker 5 chunk 15"),
    # §9 "Sync / partial sending", a parked packet and async: worker 1's chunk 5, sent at
    # round 2 and parked, is counted when it reaches the slot after a swap into async; the
    # RESULT of another member's async round that reports the swap first sends it again at
    # once, its own RESULT then settles it, and chunk 12 goes out under a sequence number.
    # The uplink out of order, the copy of round 2 meets the slot behind chunk 12, not behind
    # its number in the member cell, and is counted a second time. Replayed with the held
    # slot's chunks carried at once, as when the seed was found (with the wait, worker 0's
    # chunk 4 is reported instead).
    "hurry_into_async": (FAULT_KINDS, 9079057, {"faults": {"hurry_into_async": True,
                                                           **CARRY_HELD_AT_START}},
                         "exactly-once", "worker 1 chunk 5"),
    # §9 "Swap storms", JOIN behind the slot, where the round it named closed without me:
    # a member lost the RESULT of a peer's async round 45 and JOINed it; the JOIN, lost once
    # and sent again by the silent window 1.26 s later, is answered by round 45's RESEND
    # without its bit. Carried and not offered at the open round 46, which waits for it (a
    # sync round of the job's six), the JOIN comes back only at its next call's join_after,
    # past a peer's packet deadline there.
    "join_left_out": (FAULT_KINDS, 9039175, {"faults": {"join_left_out_waits": True}},
                      "failure", "worker 1 call 3"),
    # §9 "Swap storms", JOIN behind the slot, of the call under way only: a member's JOIN
    # sent by its stuck call on slot 20 is answered, in its next call, by a RESEND with its bit
    # on another chunk. Offered at once at slot 20's next round, a round of peers a call
    # ahead, the JOIN is held there for a second, and its RESULT, as progress of the call,
    # puts off the call's JOIN of slot 21, whose round lacks only it, past a peer's packet
    # deadline there.
    "join_left_out_of_the_call": (FAULT_KINDS, 9010355,
                                  {"faults": {"join_left_out_any_call": True}},
                                  "failure", "worker 4 call 2"),
    # §9 "Swap storms", JOIN behind the slot, refused at the next round: a member a call
    # behind (its call of key 1 waiting on slot 61) has its JOINs of four idle slots answered
    # by RESENDs with its bit on another chunk, and each, offered at once at the slot's next
    # round, where no round is open yet, is refused NOT_JOINED a slow switch's round trip
    # later. Taken for the call's progress, those refusals put off its JOIN of slot 55, whose
    # sync round 1 lacks only it, from 5.43 s to 7.11 s, past the peers' packet deadline.
    "refused_join_not_progress": (FAULT_KINDS, 9075276,
                                  {"faults": {"refused_reoffer_is_progress": True}},
                                  "failure", "worker 2 call 2"),
    # §9 "Swap storms", JOIN: a chased chunk of an earlier call is not the call's progress.
    # After a restart a member a call behind left sync rounds 1 of two slots lacking only it;
    # its next call's join_after was put off by the RESULT of a displaced chunk its previous
    # call had chased on a third slot, and the JOIN that closes both came after the peers'
    # packet deadline.
    "progress_of_the_call": (FAULT_KINDS, 9061566,
                             {"faults": {"progress_from_any_flight": True}},
                             "failure", "worker 0 call 4"),
    # §9 Failures: a call given up on its packet deadline is no sign of a silent switch. A
    # member's sync round on slot 29 waited for a lossy straggler past the deadline (3.110 s);
    # its next call parked its one chunk in a partial round 44 ms later, the switch last heard
    # 93 ms before, and failed 'unreachable' as after a give-up on silence.
    "give_up_not_silence": (FAULT_KINDS, 9068240,
                            {"faults": {"unreachable_after_any_give_up": True}},
                            "failure", "worker 1 call 2"),
    # §9 "A switch that lost the job's state", the rounds of the tag left: a member learned
    # slot 4's round 2 from a RESYNC of a state whose results it lost, did not hear the next
    # restart, learned that state's tag from its first result and applied its round 0 there;
    # its next flight, at round 2, met open round 1 (a reset shown by a RESYNC, the tag known
    # left). A second later, past the late window, the tag came back, and the RESEND of round
    # 0 that its JOIN met was applied a second time.
    "rounds_of_tag_left": (FAULT_KINDS, 9078748,
                           {"faults": {"forget_rounds_of_tag_left": True}}, "agreement",
                           "worker 2 applied slot 4 round 0"),
    # §9 "A switch that lost the job's state", an ACKed twin: a one-element key of -inf, every
    # call's packet alike. A member's sync-style packet of round 2, sent again after a swap
    # into async, is counted in async round 2 and ACKed; the next call's packet of the same
    # chunk and lanes is lost, and round 2's RESULT with the member's bit, below that packet's
    # floor, is taken for its count by a new switch state: the call ends 'reset'.
    "acked_sync_twin": (FAULT_KINDS, 9102569, {"faults": {"acked_sync_leaves_no_twin": True}},
                        "failure", "worker 4 call 1"),
    # §9 Failures, the packet's deadline: a parked packet that a chunk of the call waits
    # behind. Member 4's chunk 1, parked on slot 8 while it ran partial, was relaunched at
    # sync round 4, latched with member 2, who had died; the reply that reported the slot
    # sync put the call's chunk 7 back in the queue behind it, and async results on other
    # slots kept the dead timer quiet until 24.4 s.
    "parked_flight_deadline": (FAULT_KINDS, 9102095,
                               {"faults": {"parked_flight_no_deadline": True}}, "liveness",
                               "worker 4 call 6"),
    # §9 "Sync / partial sending", partial liveness: behind a switch 0.33 s slow, two members
    # that had no RTT sample yet parked their partial packets at the first timeout (0.32 s,
    # the initial RTO); the park's copy and every answer after it carry no sample (Karn), so
    # the RTO never grew, and each call's packets parked before their answers came: worker 0's
    # chunk 24 of key 1 was carried through three calls.
    "park_learns_rto": (FAULT_KINDS, 9086527,
                        {"faults": {"park_keeps_unlearned_rto": True}}, "starvation",
                        "worker 0's chunk(s) [24] of key 1"),
    # ... but not where the switch answered since the packet left: eight members in rounds
    # needing all, member 2's slot-15 packet held in a round open for others; backed off for
    # that, its RTO let its next answers wait in held rounds, the first sample (one such
    # wait) pinned it at rto_max, and slot 19 closed about one chunk per call of that member.
    "park_heard_keeps_rto": (FAULT_KINDS, 9110370,
                             {"faults": {"unlearned_park_backs_off_heard": True}},
                             "starvation", "worker 4's chunk(s) [11] of key 1"),
    # §9 "A switch that lost the job's state", a reply of the state left: a paused member
    # read, at once, a STALE_COUNTED's grace period run out on slot 16 (round 4 of the state
    # before two restarts) and the first results of the newest state, tag 244; its call's
    # timers ran before the call aborted, and the STALE_COUNTED taught slot 16 round 5 there.
    # Its next call's JOIN at round 5 met open round 1, a reset shown by a RESYNC; a second
    # later, past the late window, tag 244 came back, and the RESEND of slot 18 round 0 that
    # a JOIN met was applied a second time.
    "rounds_of_state_left": (FAULT_KINDS, 9109296,
                             {"faults": {"state_left_teaches_rounds": True}}, "agreement",
                             "worker 4 applied slot 18 round 0"),
    # §9 "Async", a sync-style copy still on its way: worker 1's chunk 2, sent at slot 34's
    # round 17 while the slot reported partial, is parked; its next call's start sends it
    # again at once (the swap into async not yet heard), and the RESULT of an earlier copy,
    # counted in an async round, launches the call's chunk 2 under a sequence number at once.
    # The uplink out of order, the hurried copy meets the slot behind it, its round field not
    # behind that number in the member cell, and is counted a second time.
    "sync_copy_behind_async": (FAULT_KINDS, 9081944,
                               {"faults": {"launch_past_sync_copy": True}}, "exactly-once",
                               "worker 1 chunk 2"),
    # §9 "Async", the wait for a sync-style copy, by the path's RTO: partial rounds of quorum
    # 5 that waited for slow calls put the RTO at 0.43-0.5 s (srtt 64-94 ms) on a path of
    # ~2 ms; in the swap storm five slots of two members turned async held their next
    # contributions 0.29-0.49 s behind a retransmitted copy, worker 4's call stalled half a
    # second, and on the schedule that left, in partial after the storm, worker 2's calls each
    # got one chunk through on slots 16 and 20: its chunks 0 and 12, last in the order there,
    # reached no round in its last three calls.
    "sync_copy_hold_by_rto": (FAULT_KINDS, 9125740,
                              {"faults": {"hold_past_copy_by_rto": True}}, "starvation",
                              "worker 2's chunk(s) [0, 12] of key 0"),
    # §9 Failures, the packet's deadline counts from the last RESULT of every member: behind a
    # switch 0.84 s slow, worker 0's call 4, one call behind its peers, launched chunk 2 on
    # slot 51 at 10.426 s into a round the peers had left; their last round with worker 0
    # closed at 12.963 s, their JOINs met slot 51 at 14.807 s and again at 15.65 s, and with
    # the deadline counted from launch the call failed 'unreachable' at 15.112 s.
    "deadline_from_everyone_heard": (FAULT_KINDS, 9132941,
                                     {"faults": {"flight_deadline_from_launch": True}},
                                     "failure", "worker 0 call 4"),
    # ... but not from a RESEND: member 1's retransmission into slot 40's round 0, closed long
    # before, was answered at 5.59 s with its stored RESULT of all eight members, which moved
    # the deadline of its call, stuck on sync rounds of slots 35 and 36, past the liveness
    # bound.
    "deadline_not_from_resend": (FAULT_KINDS, 10055420,
                                 {"faults": {"everyone_heard_in_resend": True}},
                                 "liveness", "worker 1 call 1"),
    # §9 "A switch that lost the job's state", every tag left is told late: a restart at
    # 0.3203 s and a re-install at 0.3232 s (tags 29, 130, 149). Member 3 learned tag 149 at
    # 0.324497 s and applied its slot 42 round 1; a late result of tag 29 (0.324652 s),
    # neither the tag known nor the one left, was taken for a third state, a late one of tag
    # 130 for a fourth, and tag 149's copy of slot 42 round 1 (0.32738 s) for a fifth: applied
    # a second time.
    "older_tag_left": (FAULT_KINDS, 10001822, {"faults": {"one_tag_left": True}}, "agreement",
                       "worker 3 applied slot 42 round 1"),
    # §9 "Sync / partial sending", a round closed on my other chunk: call 0 (key 0) ended at
    # 1.626 s with slot 24's partial round 0 (chunk 3) holding members 0 and 2's bits from its
    # packets. Member 0's next call sent chunk 7 there (1.6335 s), dropped as its duplicate;
    # the round closed at 1.6355 s with chunk 3, and the flight, answered by nothing, waited
    # out its RTO (rto_max) to 2.133 s. Slot 21's round 0 of chunk 0 waited for member 0 all
    # that time, member 2's chunk 8 parked there, and its key-1 and key-2 chunks reached no
    # round in three calls.
    "closed_by_my_other_resent": (FAULT_KINDS, 10036437,
                                  {"faults": {"closed_by_my_other_waits_rto": True}},
                                  "starvation", "worker 2's chunk(s) [7] of key 1"),
}


# The same for rules found with members that are hosts of several ranks (--hosts drawn): a
# host seed, or the name of a stored plan (tests/sim/plans/<name>.json).
HOST_MUTATIONS: dict[str, tuple[int | str, dict[str, Any], str, str]] = {
    # §9 "Swap storms", JOIN behind the slot: after a lossy phase a member's calls are behind
    # on several rounds of its idle slots; re-offered one round per join_after, the JOINs
    # realign them too slowly for the peers' packets waiting there (their deadline). The
    # plan is host seed 1003408's (32 hosts in sync, lossy both ways) with its lossy phase
    # ending at 7.8 s, not 5.09 s: with the packet deadline a timer of its own the seed no
    # longer meets the case; this plan does, as do those ending at 7.5-8.1 s (0.1 s apart).
    "join_behind": ("join_behind", {"faults": {"join_behind_waits": True}}, "failure",
                    "'unreachable'"),
    # §9 "A switch that lost the job's state", an async flight's floor: a retransmission the
    # old state counted (its RESULT lost) is counted again by a re-install, whose replies
    # with a tag are lost too; the STALE_COUNTED that answers it, with an open round behind
    # the flight's, is taken for the old state's and settles it once, the replica unflagged.
    "async_floor": (1004571, {"faults": {"async_floor_unread": True}}, "exactly-once",
                    "worker 0 chunk 0"),
    # §9 "Sync / partial sending", a forgotten copy's record: after a re-add a
    # call aborts with its chunk 3 in flight, which the new state counts in round 1; the next
    # call's chunk 1, sent at round 1, is answered STALE_COUNTED for that other packet's count
    # and, settled as counted, leaves the residual and reaches no round.
    "my_other_copy": (1018875, {"faults": {"my_other_copy_settles": True,
                                           **CARRY_HELD_AT_START}},
                      "exactly-once", "worker 1 chunk 1"),
}


# Rows replayed on the schedule their seed or plan was found on: a later rule moved each
# schedule off its case, and the row replays with that rule taken out (the flag below), with
# the row's own fix in and taken out alike; each still passes on the engine's own. Flag: rows.
FOUND_ON: dict[str, tuple[str, ...]] = {
    # plan.PROBE_PERIOD_AS_FOUND: on the engine's own, the lost probes' retransmissions go out
    # a period sooner and neither meets its race.
    "probe_period_by_difference": ("refused_mark", "join_behind"),
    # A parked packet sent again at once into a slot reported async: on the engine's own,
    # refused_mark's seed no longer meets its race.
    "hurry_into_async": ("refused_mark",),
    # A JOIN that a RESEND without its bit answers carried and not offered at once at the
    # slot's next round.
    "join_left_out_waits": ("flight_deadline",),
    # A partial packet parked at its first timeout before any RTT sample leaving the RTO as it
    # was: behind a slow switch the engine's own RTO learns the round trip after the first park.
    "park_keeps_unlearned_rto": ("settle_at_new_tag", "partial_rotation",
                                 "partial_held_slot_waits"),
    # A slot reported async sending its next contribution under a sequence number at once,
    # however recently a copy of its latest, sync-style packet went out there: the wait for
    # that copy moves each schedule (hurry_into_async's race is one the wait closes too: the
    # copy sent at once into the async slot holds the next contribution for one RTO).
    # acked_sync_twin's and rounds_of_state_left's rules are shown against a scripted switch
    # as well (tests/worker/test_acked_twin.py, test_install_tag.py).
    "launch_past_sync_copy": ("abort_discards_unsent", "hurry_into_async",
                              "give_up_not_silence", "acked_sync_twin", "rounds_of_state_left"),
    # The packet deadline counted from the packet's launch only, not from the last RESULT
    # heard whose bitmap holds every member: each row shows a JOIN that comes late, past a live
    # peer's packet deadline counted from launch; on the engine's own, that peer heard a RESULT
    # of every member after its packet left, and no call fails. give_up_not_silence's give-up
    # was such a deadline (a round waiting for a lossy straggler).
    "flight_deadline_from_launch": ("join_behind", "join_left_out", "join_left_out_of_the_call",
                                    "refused_join_not_progress", "progress_of_the_call",
                                    "give_up_not_silence"),
    # plan.HELD_RESULT_AS_FOUND, a partial RESULT that another member's contribution closed
    # giving an RTT sample: on the engine's own the RTO of a partial job learns round trips
    # only (sync_copy_hold_by_rto's seed was the RTO those samples inflated, which its rule,
    # the path's RTO, keeps out of the wait). park_learns_rto's and park_heard_keeps_rto's
    # rules are of what the RTO learns before and after its first sample; both are shown
    # against a scripted switch as well (tests/worker/test_unlearned_rto.py).
    "held_result_samples_rtt": ("join", "abort_discards_unsent", "partial_order_after_a_close",
                                "partial_held_slot_waits", "async_answer_to_sync_flight",
                                "forgotten_round", "give_up_not_silence", "park_learns_rto",
                                "park_heard_keeps_rto", "sync_copy_hold_by_rto"),
    # A flight whose round closed with my bit on another chunk waiting out its RTO (seed
    # 10036437's rule): on the engine's own such a flight is sent again at once, which moves
    # each row's seed off its case (held_result_no_rtt's on the TNA model).
    "closed_by_my_other_waits_rto": ("refused_mark", "join_left_out_of_the_call",
                                     "progress_of_the_call", "held_result_no_rtt",
                                     "deadline_not_from_resend"),
}
assert PROBE_PERIOD_AS_FOUND.keys() | HELD_RESULT_AS_FOUND.keys() <= FOUND_ON.keys()


def found_on(name: str) -> dict[str, bool]:
    """The rules row `name` replays with taken out (FOUND_ON)."""
    return {flag: True for flag, rows in FOUND_ON.items() if name in rows}


# Rows of the TNA model (plan.TOFINO, target tna-model), each of a seed of its sweep that
# violates there only: name: (seed, what takes the fix out, invariant, text its report holds).
TNA_MUTATIONS: dict[str, tuple[int, dict[str, Any], str, str]] = {
    # §9 "Sync / partial sending", timeout: a partial RESULT that another member's
    # contribution closed gives no RTT sample. Taken for one, a wait of 0.33 s in a round held
    # for the others, before any other sample, pinned member 5's RTO at rto_max; at 3.39 s its
    # packet, joined to a round of another key that the early look could not park, waited out
    # that RTO (0.23 s): its call of key 2 ended 0.3 s behind the others', their rounds on
    # slots 36 and 37 waited for it, the next two calls of key 2 of members 3 and 7 found
    # those slots held, and in the one call left chunks 14, 21, 26 and 27 met the others out
    # of step.
    "held_result_no_rtt": (9009951, {"faults": {"held_result_samples_rtt": True}},
                           "starvation", "worker 3's chunk(s) [14, 21, 26, 27] of key 2"),
}


def host_plan(source: int | str) -> tuple[str, Plan]:
    """The plan of a HOST_MUTATIONS row, and how the messages name it."""
    if isinstance(source, str):
        path = Path(__file__).parent / "plans" / f"{source}.json"
        return f"plan {source}.json", Plan.from_json(path.read_text())
    return f"host seed {source}", draw(source, FAULT_KINDS + HOST_KINDS, HOSTS_DRAWN)


def assert_caught_and_clean(name: str, which: str, plan, mutation: dict, invariant: str,
                            detail: str, target: str = "python") -> None:
    """With `name` taken out the checker reports `invariant` (with `detail`) on `target`; with
    it in, the same plan holds every invariant. `which` names the seed in the messages."""
    as_found = found_on(name)
    faults = {**as_found, **mutation.get("faults", {})}
    rec, sim = simulate(plan, target, **{**mutation, "faults": faults})
    found = [v for v in check(rec, sim) if v.startswith(invariant + ":")]
    assert any(detail in v for v in found), (
        f"{name} taken out: {which} reports no {invariant} violation with {detail!r}: "
        f"{check(rec, sim)[:3]}")
    rec, sim = simulate(plan, target, faults=as_found)
    found = check(rec, sim)
    assert not found, f"{which} fails with {name} in: {found[:3]}"
    if as_found:
        rec, sim = simulate(plan, target)
        found = check(rec, sim)
        assert not found, f"{which} fails on the engine's own schedule: {found[:3]}"


@pytest.mark.parametrize("name", HOST_MUTATIONS)
def test_the_checker_catches_the_host_rule_taken_out(name: str) -> None:
    source, mutation, invariant, detail = HOST_MUTATIONS[name]
    which, plan = host_plan(source)
    assert_caught_and_clean(name, which, plan, mutation, invariant, detail)


@pytest.mark.parametrize("name", MUTATIONS)
def test_the_checker_catches_the_rule_taken_out(name: str) -> None:
    kinds, seed, mutation, invariant, detail = MUTATIONS[name]
    assert_caught_and_clean(name, f"seed {seed}", draw(seed, kinds), mutation, invariant,
                            detail)


@pytest.mark.parametrize("name", TNA_MUTATIONS)
def test_the_checker_catches_the_rule_taken_out_on_the_tna_model(name: str) -> None:
    seed, mutation, invariant, detail = TNA_MUTATIONS[name]
    assert_caught_and_clean(name, f"tna-model seed {seed}", draw(seed, model=TOFINO), mutation,
                            invariant, detail, target="tna-model")
