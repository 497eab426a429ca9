// Protocol rules a simulation takes out, one at a time, to show that its checker finds the
// race each rule closes (tests/sim/test_races.py). Only the in-memory backend's engines take
// them (bind.cc refuses them with a socket): a worker always runs every rule.
#pragma once

namespace hysync::worker {

struct Faults {
  // Act on every reply as if it answered the latest transmission: no transmission-number
  // echo (docs/protocol.md §9, "Swap storms").
  bool ignore_echo = false;
  // Never send a displaced chunk again (send_chased; §9, "Displaced chunks").
  bool no_chase = false;
  // The quantizer pins what overflows at the bound and sends NaN as 0: no overflow sentinel
  // (§9, "Non-finite values").
  bool pin_overflow = false;
  // Never act on a sign that the switch's state for the job is new (switch_reset; §9, "A
  // switch that lost the job's state"): no abort, no resync flag, the slots keep their rounds.
  bool no_restart_detection = false;
  // No packet deadline (waited_too_long; §9 Failures): only the switch's silence fails a call.
  bool no_flight_deadline = false;
  // The packet deadline covers the call's own packets only, not a packet of another kind (a
  // JOIN of zeros) that holds a slot while a chunk of the call waits behind it.
  bool own_flight_deadline = false;
  // The packet deadline skips a parked packet outright, also one that holds a slot while a
  // chunk of the call waits behind it (a parked packet whose slot a reply reported sync
  // again, follow_mode): a round latched in sync with a dead member holds that chunk for ever
  // while the other slots' async results keep the call alive (Flights::flight_deadline).
  bool parked_flight_no_deadline = false;
  // An abort sends what it had queued for the flights it forgets (drop_flights), so a new
  // switch state may count what the residual holds again.
  bool send_dropped = false;
  // A late packet of the state left is told by when it is read, not by when it arrived (§9,
  // "A switch that lost the job's state"): one read after a long pause between calls is taken
  // for a newer state.
  bool read_time_window = false;
  // A reply that shows a new state by its tag and counted my flight does not settle it: the
  // reset forgets the flight and the residual keeps what the new state counted (§9).
  bool forget_counted_at_reset = false;
  // A relayed RESYNC (flag RELAYED: a leaf's relay of the spine's refusal of the sum that holds
  // my contribution) is taken for a reply to another member and ignored: only replies to my own
  // transmissions settle a flight (§11, "What a host does").
  bool ignore_relayed = false;
  // Behind a leaf, a STALE reply whose open round is one behind my flight's is taken for a new
  // switch state, as one not ahead of it (§9), not for a leaf that took its round back open
  // after a spine CHUNK_MISMATCH (§11, "What a host does").
  bool no_step_back = false;
  // Behind a leaf, a relayed spine RESULT in partial for my flight's round and chunk without my
  // bit does not settle the flight: it waits for the answer to its own retransmission, an RTO
  // later (§11, "What a host does"), and its rack trails every later race at the spine.
  bool leaf_verdict_waits = false;
  // Partial: every call sends a slot's chunks in their fixed order, not least recently closed
  // first (order_queue; §9 "Sync / partial sending", bounded staleness).
  bool fixed_order = false;
  // Partial: the order is drawn at the call's start only; a chunk still queued that a round
  // then closes with keeps its turn (Flights::round_closed).
  bool order_at_start = false;
  // Partial: a chunk of the call that a round of another chunk of its key displaced
  // (CHUNK_MISMATCH) is carried to the key's next call; not offered again, as residual, once
  // that round closes (Flights::round_closed; §9 "Sync / partial sending").
  bool no_reoffer = false;
  // Partial: a call that starts on a slot held by a parked packet runs the timers that fell
  // due between calls before it hurries that packet, so the packet's own timer, if due,
  // carries the call's chunks there at once, not after one RTO for the hurry's answer
  // (Flights::start_call; §9 "Sync / partial sending", partial liveness).
  bool carry_held_at_start = false;
  // A JOIN that the stored result of the round it named answers (RESEND: that round had
  // closed) is offered again only after join_after, not at once at the slot's next round
  // (§9 "Swap storms", JOIN).
  bool join_behind_waits = false;
  // The same for a JOIN whose named round closed without me (a RESEND without my bit, or with
  // it on another chunk): carried, and offered again only after join_after (§9 "Swap storms").
  bool join_left_out_waits = false;
  // ... and a JOIN of an earlier call so answered is offered at once at the slot's next
  // round too, for the call under way, which is not stuck: that JOIN can be held in a round
  // of peers a call ahead, and its result puts off the call's own JOINs (§9 "Swap storms").
  bool join_left_out_any_call = false;
  // A JOIN offered at once at the slot's next round after a RESEND answered the one before,
  // and refused there (NOT_JOINED: no round open), counts as progress of the call and puts
  // off its JOINs of the other idle slots by another join_after (Flights::done; §9 "Swap
  // storms").
  bool refused_reoffer_is_progress = false;
  // A displaced chunk that an earlier call chased (send_chased) counts, when it settles, as
  // progress of the call under way and puts off its JOINs (Flights::done; §9 "Swap storms").
  bool progress_from_any_flight = false;
  // After any call given up, a packet deadline's too, every later call that ends only by
  // carrying is unreachable until the switch is heard, however recently it answered before
  // (Engine::unheard_since_give_up; §9 Failures).
  bool unreachable_after_any_give_up = false;
  // A RESYNC answering an async-style flight with an open round behind the one the slot had
  // reached when the flight was launched is not taken for a new switch state (Replies::
  // on_resync; §9 "A switch that lost the job's state"): a STALE_COUNTED of a re-install that
  // counted a retransmission the old state had counted too settles it once, unflagged.
  bool async_floor_unread = false;
  // A RESYNC in async answering a sync-style flight with an open round behind the flight's
  // round is not taken for a new switch state (Replies::on_resync; §9 "A switch that lost the
  // job's state"): the flight, counted by the old state in a round whose result I lost, is
  // carried as residual with the replica unflagged - counted twice.
  bool async_answer_unread = false;
  // An ACK that settles a sync-style flight as counted leaves its round unsuspected
  // (counted_without_result; §9 RULE A): a result lost to every member goes unnoticed.
  bool ack_leaves_no_suspect = false;
  // An ACK or STALE_COUNTED for a flight whose round closed with my bit on another chunk (a
  // packet an aborted call forgot, counted after the abort) settles the flight as counted
  // (counted_without_result; §9 "Sync / partial sending"): its amount leaves the
  // residual and reaches no round.
  bool my_other_copy_settles = false;
  // A flight whose sequence number the switch refused while my other contribution sat in the
  // open round is still taken as not counted by an ACK or STALE_COUNTED once that round closed
  // with my bit on the other chunk (counted_without_result): the refusal mark had replaced the
  // other's record, the flight was counted (in async, its round field a sequence number), and
  // its amount is carried and counted twice.
  bool refused_mark_unread = false;
  // The silent window's probe period is tested as a difference, now - probed_at_ < silence
  // (Flights::expire), not as the timers are armed: a probe's own retransmission, due exactly
  // one period after it, can round below the period and wait rto_max more (§9 Failures).
  bool probe_period_by_difference = false;
  // A flight sent at the round where the last abort forgot a packet of mine of another chunk
  // on the slot takes an ACK or STALE_COUNTED there for its own count unless the round's
  // RESULT showed my bit on the other chunk (counted_without_result; §9 "Sync / partial
  // sending"): with that RESULT lost, its amount leaves the residual and reaches no round.
  bool forgotten_round_unread = false;
  // A parked sync-style packet is sent again at once when a reply reports its slot async
  // (Flights::hurry), as in sync: with the uplink out of order, the copy can reach the slot
  // behind my next contribution there, whose sequence number the copy's round field is not
  // behind (§4 step 10, the async window), and be counted a second time.
  bool hurry_into_async = false;
  // A reset shown by a RESYNC forgets, with every slot's rounds, which rounds it had seen
  // under the tag it leaves (Rounds::seen_under_tag_left; §9 "A switch that lost the job's
  // state"): where that tag was the state's that answered (its rounds taught by an older
  // state, whose tag never reached me), its results heard again after the late window, a
  // JOIN's RESEND above all, are applied a second time.
  bool forget_rounds_of_tag_left = false;
  // An ACK or STALE_COUNTED that settles a sync-style flight as counted leaves no ACKed twin
  // (counted_without_result), and an async RESULT of mine below my async flight's floor that
  // an ACKed twin or a result of mine kept matches settles that flight as counted (Replies::
  // on_full; §9 "A switch that lost the job's state"): the async round's result of a
  // sync-style packet counted after a swap into async, same chunk and lanes as the next
  // call's packet, is taken for that packet counted behind its floor - a reset on no
  // restart, and the packet, lost, settled as counted.
  bool acked_sync_leaves_no_twin = false;
  // Partial: a packet parked at its first timeout, before any RTT sample, leaves the RTO as
  // it was (Flights::expire): the park's copy and every later answer are retransmissions
  // (Karn: no sample), so behind a switch slower than that RTO the RTO never grows,
  // and each call's packets time out and park before their answers come (§9 "Sync / partial
  // sending", partial liveness).
  bool park_keeps_unlearned_rto = false;
  // ... and backs it off even where the switch answered since the packet left (a round held
  // open for others, not a long round trip; seed 9110370).
  bool unlearned_park_backs_off_heard = false;
  // A STALE_COUNTED whose grace period ends after a reset (a call's timers run before it
  // aborts on the new state, Engine::step) teaches the new state's rounds the round the state
  // left counted the flight in (counted_without_result; §9 "A switch that lost the job's
  // state"): the slot's next round jumps ahead of the new state's open round, the next JOIN
  // there is answered STALE with the open round behind it, a false reset forgets the new
  // state's rounds, and its results heard again past the late window are applied twice.
  bool state_left_teaches_rounds = false;
  // A slot reported async launches its next contribution under a new sequence number at
  // once, even while a copy of the sync-style packet it last sent (a call's hurry of a parked
  // packet, a timer's retransmission) may still be on its way (Flights::send_next; §9 "Async"):
  // with the uplink out of order the copy can reach the slot behind that contribution, its
  // round field not behind the new number in my member cell (§4 step 10, the async window),
  // and be counted a second time.
  bool launch_past_sync_copy = false;
  // That contribution waits until the copy is one RTO old by the RTO that times packets out,
  // learned from answers that waited in open rounds for the other members' packets, not by
  // the path's (Rto::path, Flights::hold_past_sync_copy): after partial rounds that waited
  // for slow calls it holds a slot turned async up to rto_max on a path of a few
  // milliseconds, and stalls the call (seed 9125740: a chunk of another member starved).
  bool hold_past_copy_by_rto = false;
  // The packet deadline counts from the flight's launch (or from when a chunk of the call
  // began to wait behind it) only, not from the last RESULT heard whose bitmap holds every
  // member (Flights::flight_deadline; §9 Failures): behind a slow switch, a job whose members
  // are alive but a call out of step, whose round closes only by the JOINs of members gone on
  // to their next call (join_after after their last progress, then two round trips), fails
  // the call while every member is seen at work (seed 9132941).
  bool flight_deadline_from_launch = false;
  // ... and a RESEND (the stored RESULT of a round closed before) counts as such a RESULT,
  // though it shows nothing of the members now (seed 10055420: a call stuck on other slots
  // outlived the job's liveness bound).
  bool everyone_heard_in_resend = false;
  // Partial: a RESULT that another member's contribution closed gives an RTT sample for the
  // flight of mine it settles (Flights::rtt_sample): the wait in a round held open for the
  // others is taken for a round trip, and one such wait pins the RTO at rto_max; a packet
  // the early look could not park then waits out that RTO in a round held for others, and its
  // call runs far behind the others' (seed 9009951 on the TNA model).
  bool held_result_samples_rtt = false;
  // Only the tag left last is told late (Rounds::see_tag; §9 "A switch that lost the job's
  // state"): after a restart and a re-install in quick succession, a late packet of the
  // install before the restart is taken for a third state, the tags flip to and fro, each flip
  // a reset that forgets the slots' rounds, and the known state's results heard again are
  // applied twice (seed 10001822).
  bool one_tag_left = false;
  // A flight whose round closed with my bit on another chunk (a packet of mine an aborted call
  // forgot held my place there; Replies::on_full) waits out its RTO, though the switch dropped
  // it there as my duplicate and no answer to it will come (Flights::closed_by_my_other): after
  // the faults, with the RTO at rto_max, its call runs that far behind the others, whose rounds
  // of the next keys wait for it (seed 10036437: starvation).
  bool closed_by_my_other_waits_rto = false;
};

}  // namespace hysync::worker
