// The switch's replies (replies.h).
#include "worker/replies.h"

#include <cstring>
#include <string>

#include "worker/wire_names.h"

namespace hysync::worker {

namespace {

constexpr uint8_t CHUNK_MISMATCH = uint8_t(wire::ResyncReason::CHUNK_MISMATCH),
                  STALE_COUNTED = uint8_t(wire::ResyncReason::STALE_COUNTED),
                  NOT_JOINED = uint8_t(wire::ResyncReason::NOT_JOINED);

bool ahead(uint32_t a, uint32_t b) { return uint32_t(a - b) < HALF32; }  // a >= b, mod 2^32

const char* op_name(uint8_t op) { return wire::name(wire::Op(op)); }

}  // namespace

// Why a datagram does not decode (hysync.wire.Packet.decode's messages), or "" if it does.
std::string decode_error(const uint8_t* d, std::size_t size) {
  if (size < H)
    return "HySync header needs " + std::to_string(H) + " bytes, got " + std::to_string(size);
  const uint8_t version = d[wire::OFF_VERSION], op = d[wire::OFF_OP];
  if (version != wire::VERSION)
    return "HySync version " + std::to_string(version) + ", this build speaks " +
           std::to_string(wire::VERSION);
  const bool full = op == uint8_t(wire::Op::CONTRIB) || op == uint8_t(wire::Op::RESULT);
  if (!full && op != uint8_t(wire::Op::RESYNC) && op != uint8_t(wire::Op::ACK))
    return "unknown HySync op " + std::to_string(op);
  const std::size_t want = full ? P : H;
  if (size != want)
    return std::string(op_name(op)) + " must be " + std::to_string(want) + " bytes, got " +
           std::to_string(size);
  return "";
}

void Replies::on_datagram(const uint8_t* data, std::size_t size, double now, double arrived) {
  arrived_ = faults_.read_time_window ? now : arrived;
  if (size == P)
    on_full(data, now);
  else
    on_short(data, size, now);
}

// A full-size datagram: a RESULT, or garbage.
void Replies::on_full(const uint8_t* d, double now) {
  const Header h = wire::load_header(d);
  const uint32_t i = uint32_t(h.slot) - cfg_.slot_base;
  if (h.version != wire::VERSION || h.op != uint8_t(wire::Op::RESULT) || h.job_id != cfg_.job_id ||
      h.slot < cfg_.slot_base || i >= w_ || h.count == 0) {
    std::string reason = decode_error(d, P);
    if (reason.empty())
      reason = "op " + std::to_string(h.op) + " job " + std::to_string(h.job_id) + " slot " +
               std::to_string(h.slot) + " count " + std::to_string(h.count) +
               ": not a RESULT of job " + std::to_string(cfg_.job_id) + " slots " +
               std::to_string(cfg_.slot_base) + ".." + std::to_string(cfg_.slot_base + w_ - 1);
    results_.bad(reason);
    return;
  }
  flights_.heard(now);
  // Every member in the round: my peers alive and at work (the packet deadline, seed
  // 9132941). Not in a job of one: there is no peer to be out of step with, and a round of
  // mine alone says nothing of another slot's packet held or lost.
  // A RESEND of a round closed before shows nothing of now (seed 10055420: a member's
  // retransmission into an old round was answered with its stored RESULT of every member,
  // which moved the deadline of a call stuck on other slots past the job's liveness bound).
  const bool resent = h.flags & uint8_t(wire::Flag::RESEND);
  if (cfg_.members > 1 && __builtin_popcount(uint32_t(h.bitmap)) >= cfg_.members &&
      (!resent || faults_.everyone_heard_in_resend))
    flights_.heard_everyone(now);
  // My bit with my flight's chunk in its round (async: a round of one with its lanes): the
  // round counted my flight. If this result is what shows the state to be new, it settles the
  // flight before the reset forgets it, or the residual would keep what the new state counted.
  const bool mine = h.bitmap & bit_;
  auto counts = [&](const Flight* f) {
    return f && mine && f->chunk == h.chunk &&
           (h.mode != ASYNC ? h.round == f->round
                            : h.count == 1 && std::memcmp(d + H, &f->data[H], 4 * LANES) == 0);
  };
  if (!current_state(h.reason, i, "RESULT", counts(slots_[i].flight.get()), now)) return;
  slots_[i].mode = h.mode;
  bool fresh = rounds_.is_new(i, h.round);
  if (fresh && !faults_.forget_rounds_of_tag_left &&
      rounds_.seen_under_tag_left(h.reason, i, h.round)) {
    // The tag the last reset left, heard again, of a round this slot had seen under it: the
    // reset was shown by a RESYNC against a round taught before the tag was learned, so this
    // tag may be the state that answered, whose round this worker applied already (seed
    // 9078748: the RESEND its JOIN met after the reset). A duplicate then; were the tag a
    // newer install's after all, a result the replica misses, which the flag owns.
    fresh = false;
    rounds_.flag_resync("a RESULT of slot " + std::to_string(cfg_.slot_base + i) + " round " +
                        std::to_string(h.round) + " of the state left, seen before, came again");
  }
  Flight* f = slots_[i].flight.get();
  const bool counted = counts(f);
  // My contribution closed the round (its RESULT names me): the switch answered as my packet
  // arrived, and the answer's wait is the path's alone (Rto::path).
  if (counted && h.worker_id == cfg_.worker_id) flights_.path_sample(i, now);
  // RULE A for this result, once. Before a flight it settles is done where possible: done()
  // sends the slot's next chunk, whose non-finite elements this result may absorb
  // (prepare_chunk) - in partial, the round that closed without me holds the element already.
  bool taken = false;
  auto take_result = [&] {
    taken = true;
    if (!fresh) {
      ++stats_.duplicate_results;
      return;
    }
    if (mine && h.mode == ASYNC && h.count == 1) {
      const auto it = results_.acked_entry(i, d);
      if (it != slots_[i].acked.end()) {
        slots_[i].acked.erase(it);  // its ACK applied it already
        return;
      }
    }
    if (mine) {  // the result an ACKed twin awaited (its async round's, or its sync round's)
      const auto twin = results_.twin_entry(i, d);
      if (twin != slots_[i].twins.end()) slots_[i].twins.erase(twin);
    }
    results_.apply(d);
    flights_.round_closed(i, h.chunk, h.round, now);
  };
  // My async flight's lanes in a round that cannot have counted it within the state that
  // taught me this slot's rounds: below the round the slot had reached when I sent it (rounds
  // never step back), or - sent before I knew the slot - one whose number I applied already.
  const bool below_floor = counted && h.mode == ASYNC &&
                           (f->floor_known ? !ahead(h.round, f->floor) : !fresh);
  // ... and the result of another contribution of mine with the same chunk and lanes: a
  // twin an ACK settled (async, applied from its lanes; or sync-style, its result awaited)
  // or a late copy of one of my last results.
  const bool twins_result = below_floor && (results_.acked_entry(i, d) != slots_[i].acked.end() ||
                                            results_.twin_entry(i, d) != slots_[i].twins.end() ||
                                            results_.seen_own(i, d));
  if (below_floor && !twins_result) {
    // My async contribution, counted, closed a round that cannot be of the state that taught
    // me this slot's rounds: one below the round the slot had reached when I sent it (rounds
    // never step back), or - sent before I knew the slot - one whose number I applied already
    // (an async round holds one contribution, and a copy of a result of mine finds its flight
    // settled). The state that counted it is new, and results of its rounds that I took for
    // duplicates of the old state's were never applied (an async contribution is counted
    // whatever its sequence number, so nothing else tells): the replica must be resynchronized.
    // (Not a late copy of one of my last results, nor the result of an ACKed twin: same
    // chunk, same lanes.)
    const uint32_t floor = f->floor;
    const bool floor_known = f->floor_known;
    flights_.done(i, true, now);  // counted, by the new state
    switch_reset("the switch counted my async contribution on slot " +
                 std::to_string(cfg_.slot_base + i) + " in round " + std::to_string(h.round) +
                 (floor_known ? ", behind round " + std::to_string(floor) +
                                    " that it had reached before"
                              : ", a round I had applied already"));
    fresh = rounds_.is_new(i, h.round);  // the first round of the new state heard on this slot
    results_.keep_own(i, d);
  } else if (twins_result && !faults_.acked_sync_leaves_no_twin) {
    // That other contribution's result, not my flight's count: applied as such (RULE A, once),
    // and the flight waits for its own answer. Settled by it, a flight the switch never
    // received left its amount out of the residual (seed 9102569: the async round's result
    // of a sync-style packet ACKed after a swap into async, its lanes the next call's).
    take_result();
    results_.keep_own(i, d);
  } else if (counted) {
    take_result();
    if (h.mode == ASYNC) results_.keep_own(i, d);
    // A JOIN answered by the stored result of the round it named: that round had closed (with
    // my place in it) and the slot's open round is the next, which may be waiting for me.
    const bool join_behind = f->join && (h.flags & uint8_t(wire::Flag::RESEND)) &&
                             h.mode != ASYNC && !faults_.join_behind_waits;
    // A partial round that another member's contribution closed held mine until that one
    // came: the delay was the others' (their next call, a pause), not a round trip, and gives
    // no RTT sample (Flights::rtt_sample), as an answer to a retransmission gives none. Taken
    // for one, a wait of 0.33 s before any other sample pinned a member's RTO at rto_max, and
    // 3 s later its packet that the early look could not park waited out the RTO (0.23 s) in
    // a round held for others: its call ended 0.3 s behind the others', their rounds on two
    // slots waited for it, and their next calls found those slots held (seed 9009951 on the
    // TNA model: two members' chunks of key 2 reached no round). A round my packet closed is
    // a round trip. (Not behind a leaf: a relayed spine RESULT names the spine's member that
    // closed it, a leaf, never me.)
    if (h.mode == PARTIAL && h.worker_id != cfg_.worker_id && !cfg_.behind_leaf &&
        !faults_.held_result_samples_rtt)
      f->held_for_others = true;
    flights_.done(i, true, now);
    if (join_behind && call_ && !slots_[i].flight && call_->queues[i].empty())
      flights_.offer_join(i, now, true);
  } else if (f && h.round == f->round && !f->async_style) {
    // (My bit with another chunk, or in an async round my chunk with other lanes: another
    // contribution of mine holds my place in the round - one an aborted call forgot, or an
    // async one of an earlier call whose round number this flight, a JOIN above all, was sent
    // to; this packet is not in it.)
    // The round I sent to closed without me. Only the switch's answer to my own packet (a
    // RESEND, a RESYNC) settles it: if the slot turns async before my packet arrives, the
    // switch counts it in an async round instead. A RESEND settles it whatever mode that
    // round had: a round that closed async (a swap between my sends) is resent for my
    // round number as long as it is the slot's last (docs/protocol.md, swap storms).
    if ((h.flags & uint8_t(wire::Flag::RESEND)) && h.worker_id == cfg_.worker_id &&
        answers_latest(i, h.flags)) {
      // Carried as residual (whatever chunk or mode it had); a sentinel of mine that the
      // round's own sum holds non-finite already is absorbed there (round() of done()).
      // A JOIN so answered named a round that had closed without me: as for one that closed
      // with my place in it (above), the slot's open round is the next, which may be waiting
      // for me, and the JOIN is offered there at once. The round's mode is the stored
      // round's: a RESEND comes only from a slot latched sync or partial (§4 step 10).
      // Only a JOIN of the call under way: one an earlier call's stall sent says nothing of
      // this call, whose own join_after offers its JOINs (seed 9010355).
      const bool join_behind =
          f->join && !faults_.join_left_out_waits &&
          (f->call == flights_.call_under_way() || faults_.join_left_out_any_call);
      take_result();
      flights_.done(i, false, now, true, h.chunk == f->chunk ? d : nullptr);
      if (join_behind && call_ && !slots_[i].flight && call_->queues[i].empty())
        flights_.offer_join(i, now, true);
    } else if (cfg_.behind_leaf && h.mode == PARTIAL && h.chunk == f->chunk &&
               !faults_.leaf_verdict_waits) {
      // Behind a leaf, this result is the spine's verdict on my round, relayed by my leaf
      // after it acted on it: the sum that held me was refused, or the round I sent to never
      // reached the spine, or my leaf's partial round closed without me. In each case the leaf
      // is past my round for good (it takes a round back open only before the spine closes
      // it), so no transmission of mine can be counted there: carried now, as the RESEND my
      // retransmission would get says, and not an RTO later, which would leave my rack
      // behind in every later race at the spine (docs/protocol.md §11, "What a host does").
      take_result();
      flights_.done(i, false, now, true, d);
    } else if (h.mode != ASYNC) {
      // My packet, dropped there as my duplicate, gets no answer: sent again now, not an RTO
      // later (Flights::closed_by_my_other; seed 10036437). Once: the answers to the copies
      // sent before it (a RESEND of an earlier transmission) land here too.
      const bool seen_closed = f->closed;
      f->closed = true;
      f->closed_chunk = h.chunk;
      f->closed_by_my_other = mine;
      if (mine && !seen_closed) flights_.closed_by_my_other(i, now);
    }
  }
  if (h.mode != PARTIAL) flights_.follow_mode(i, now);
  if (!taken) take_result();
}

// A header-only datagram: RESYNC or ACK, or garbage.
void Replies::on_short(const uint8_t* d, std::size_t size, double now) {
  if (size != H) {
    results_.bad(size > P ? "datagram longer than a " + std::to_string(P) + "-byte HySync packet"
                 : decode_error(d, size));
    return;
  }
  std::string err = decode_error(d, size);
  if (!err.empty()) {
    results_.bad(err);
    return;
  }
  const Header h = wire::load_header(d);
  const uint32_t i = uint32_t(h.slot) - cfg_.slot_base;
  // A leaf's relay of the spine's verdict carries the leaf's member id at the spine, not mine:
  // whom it concerns is its bitmap (docs/protocol.md §11, "What a host does").
  if (h.op == uint8_t(wire::Op::RESYNC) && (h.flags & uint8_t(wire::Flag::RELAYED)) &&
      h.job_id == cfg_.job_id && h.slot >= cfg_.slot_base && i < w_) {
    on_relayed(i, h, now);
    return;
  }
  const bool reply = h.op == uint8_t(wire::Op::RESYNC) || h.op == uint8_t(wire::Op::ACK);
  if (h.job_id != cfg_.job_id || h.slot < cfg_.slot_base || i >= w_ ||
      h.worker_id != cfg_.worker_id || !reply) {
    results_.bad(std::string(op_name(h.op)) + " for job " + std::to_string(h.job_id) + " worker " +
        std::to_string(h.worker_id) + " slot " + std::to_string(h.slot) +
        " is not a reply to worker " + std::to_string(cfg_.worker_id) + " of job " +
        std::to_string(cfg_.job_id));
    return;
  }
  // The dead timer hears only replies that show the switch moving this worker's work along:
  // a STALE_ROUND or NOT_JOINED answers any packet, forever, from a switch that lost the job's
  // state or from a job that waits for a dead member, and must not keep a dead call alive;
  // nor may the CHUNK_MISMATCH a JOIN meets in such a job (a round of others, open forever).
  const Flight* f = i < w_ ? slots_[i].flight.get() : nullptr;
  if (h.op == uint8_t(wire::Op::ACK) || h.reason == STALE_COUNTED ||
      (h.reason == CHUNK_MISMATCH && !(f && f->join)))
    flights_.heard(now);
  // An ACK that answers my flight's latest transmission says the switch counted it.
  const bool counts_flight = h.op == uint8_t(wire::Op::ACK) && f && h.round == f->round &&
                             h.chunk == f->chunk && answers_latest(i, h.flags);
  if (h.op == uint8_t(wire::Op::ACK) && !current_state(h.reason, i, "ACK", counts_flight, now))
    return;
  slots_[i].mode = h.mode;
  if (h.op == uint8_t(wire::Op::ACK))
    on_ack(i, h.round, h.chunk, now);
  else
    on_resync(i, h.reason, h.round, h.chunk, h.mode, h.count, h.bitmap, h.flags, now);
  if (h.mode != PARTIAL) flights_.follow_mode(i, now);
}

void Replies::on_ack(uint32_t i, uint32_t rnd, uint32_t chunk, double now) {
  ++stats_.acks;
  Flight* f = slots_[i].flight.get();
  if (!f || rnd != f->round || chunk != f->chunk) {
    ++stats_.stray_replies;
    return;
  }
  flights_.counted_without_result(i, now);
}

void Replies::on_resync(uint32_t i, uint8_t reason, uint32_t rnd, uint32_t chunk, uint8_t mode,
                       uint32_t count, uint32_t bitmap, uint8_t flags, double now) {
  if (reason > NOT_JOINED) {
    results_.bad("RESYNC with unknown reason " + std::to_string(reason));
    return;
  }
  ++stats_.resyncs[reason];
  rounds_.advance(i, rnd);
  Flight* f = slots_[i].flight.get();
  if (!answers_latest(i, flags)) {
    // It answers an earlier transmission; a later one may still be counted (the slot may turn
    // async meanwhile, which counts any new sequence number), so only the answer to the latest
    // may settle the flight as not counted or send it again under another round.
    ++stats_.stray_replies;
    return;
  }
  // A RESYNC carries the slot's open round, which within one install never steps back. My
  // async-style flight knew the round the slot had reached when I launched it: an answer to
  // its latest transmission with an open round behind that one is a new state's (an async
  // flight's own round field is a sequence number, so the sync-style test below cannot tell).
  // So is an answer in async to a sync-style flight with an open round behind the flight's
  // own, a round this switch taught me (the sync-style test below reads sync and partial
  // answers only: in async a STALE_ROUND says the switch refused this round field before,
  // whatever its open round). Missed, the flight is carried unflagged while the old state may
  // have counted it in a round whose result I lost (seed 9036984: two STALE answers of a
  // re-install lost, the third after a swap to async).
  // A STALE_COUNTED there says the new state counted it: settled as counted before the reset
  // forgets it (the old state may have counted it too, a fate the flag below owns).
  const bool behind_mine =
      f->async_style
          ? f->floor_known && !faults_.async_floor_unread && !ahead(rnd, f->floor)
          : mode == ASYNC && !faults_.async_answer_unread && !ahead(rnd, f->round);
  if (behind_mine && !cfg_.behind_leaf) {
    if (reason == STALE_COUNTED && !faults_.forget_counted_at_reset)
      flights_.done(i, true, now, false);
    switch_reset("the switch answered my " +
                 std::string(f->async_style ? "async " : "") + "contribution on slot " +
                 std::to_string(cfg_.slot_base + i) + " with open round " + std::to_string(rnd) +
                 ", behind round " + std::to_string(f->async_style ? f->floor : f->round) +
                 (f->async_style ? " that it had reached before" : " that it taught me"),
                 rounds_.taught_before_tag(i));
    return;
  }
  if (reason == NOT_JOINED) {
    if (!f->join) {
      ++stats_.stray_replies;
      return;
    }
    // Not counted: the residual stays mine. A JOIN offered at once at the slot's next round,
    // on a RESEND that answered the one before, and refused there is no progress of the call:
    // such a round is most often one the others have not opened yet (a later call's chunk),
    // and counted as progress, each refusal put off the call's JOINs of its other idle slots
    // by another join_after - behind a slow switch, its round trip after every RESEND - while
    // a round there lacked only me (seed 9075276).
    flights_.done(i, false, now, true, nullptr,
                  !f->join_at_once || faults_.refused_reoffer_is_progress);
    // A round is open, yet my JOIN was refused: it met the mark an earlier JOIN of mine at
    // this round left when no round was open, and spent it (docs/protocol.md §4 step 9, the
    // JOIN mark): offer the JOIN again now rather than after another join_after.
    if (mode != ASYNC && count > 0 && call_ && !slots_[i].flight && call_->queues[i].empty())
      flights_.offer_join(i, now);
    return;
  }
  if (reason == CHUNK_MISMATCH) {
    // Only a contribution for the open round (rnd) with another chunk gets this.
    if (f->async_style || rnd != f->round || chunk == f->chunk) {
      ++stats_.stray_replies;
      return;
    }
    flights_.retarget(i, chunk, rnd, mode, now);
    return;
  }
  // STALE_*: the contribution's round was neither open nor just closed, so the open round is at
  // least two ahead of a sync-style round in flight. (Not in async, which ignores rounds: there
  // a STALE_ROUND says the switch refused this round field before, §4 step 8.)
  // Behind a leaf, the round just closed may have no result yet: its sum is at the spine, and
  // a host late for it (a partial round at the leaf) is told STALE_ROUND (§11, the leaf).
  const uint32_t least = cfg_.behind_leaf ? 1 : 2;
  // Behind a leaf, the open round may also be one behind my flight's: the spine answered the
  // leaf's sum of that round CHUNK_MISMATCH, and the leaf took the round back open for the
  // spine's chunk (§11, the leaf, step 5), after its next round had opened. No result of that
  // round exists yet, so it is my next round again: a refusal, as any other STALE reply.
  const bool stepped_back = cfg_.behind_leaf && !faults_.no_step_back && !f->async_style &&
                            mode != ASYNC && reason == uint8_t(wire::ResyncReason::STALE_ROUND) &&
                            rnd + 1 == f->round;
  if (stepped_back) {
    rounds_.step_back(i, rnd);
  } else if (!f->async_style && mode != ASYNC &&
             !(uint32_t(rnd - f->round) >= least && uint32_t(rnd - f->round) < HALF32)) {
    // The answer to my latest transmission says my round is not stale behind the open one:
    // the round I learned from this switch is ahead of it, or just closed with no result kept.
    // Rounds never step back and a result is kept until the next close, so the switch's state
    // for the job is new: it restarted, or the job was installed again (docs/protocol.md §9).
    switch_reset("the switch answered slot " + std::to_string(cfg_.slot_base + i) +
                 " with open round " + std::to_string(rnd) + " for a contribution at round " +
                 std::to_string(f->round),
                 rounds_.taught_before_tag(i));
    return;
  }
  // My sequence number refused while my bit sat in the open round (a probe after an abort, whose
  // forgotten packet the round counted): the switch's refusal mark replaced that count's record
  // (docs/protocol.md §4 step 8; a sequence number is never behind a sync round), so a later
  // ACK or STALE_COUNTED for this flight's round is its own count, not the forgotten packet's.
  if (reason == uint8_t(wire::ResyncReason::STALE_ROUND) && f->async_style && mode != ASYNC &&
      (bitmap & bit_) && !faults_.refused_mark_unread)
    f->refused_over_my_other = true;
  flights_.stale_reply(i, reason, mode, now);
}

// A RESYNC a leaf relayed from the spine (flag RELAYED): the spine did not count the leaf's sum
// that holds my contribution (docs/protocol.md §11). Its bitmap names the hosts in that sum; a
// STALE_ROUND names my flight by its chunk (the spine's round may be ahead of the sum's), a
// CHUNK_MISMATCH by its round (the sum's: the spine answers it only for its open round) and
// carries the chunk that round aggregates. It settles the flight whatever transmission it
// echoes: the leaf counted exactly one of mine in the sum and has marked me refused for that
// round, so none other can be counted there. (The relay echoes no transmission of mine, and the
// spine's round in it may be any distance ahead of my flight's: neither says anything here.)
void Replies::on_relayed(uint32_t i, const wire::Header& h, double now) {
  ++stats_.relayed;
  Flight* f = slots_[i].flight.get();
  const bool mismatch = h.reason == CHUNK_MISMATCH;
  if (faults_.ignore_relayed || !(h.bitmap & bit_) || h.mode == ASYNC ||
      (h.reason != uint8_t(wire::ResyncReason::STALE_ROUND) && !mismatch) || !f ||
      f->async_style || (mismatch ? h.round != f->round || h.chunk == f->chunk
                                  : h.chunk != f->chunk)) {
    ++stats_.stray_replies;
    return;
  }
  ++stats_.resyncs[h.reason];
  slots_[i].mode = h.mode;
  rounds_.advance(i, h.round);
  if (mismatch) {
    flights_.heard(now);
    flights_.retarget(i, h.chunk, h.round, h.mode, now);
  } else {
    flights_.refused(i, h.mode, now);
  }
  if (h.mode != PARTIAL) flights_.follow_mode(i, now);
}

// The switch's state for the job is new. What the old state counted of the packets in flight
// is unknown (counted in a round that closed, whose result this worker missed; or wiped in an
// open round), so the call aborts: its chunks keep their full value as residual and the
// replica must be resynchronized, as after any abort. Every slot forgets its rounds, so the
// next call learns the new ones (a probe, as at the start) instead of sending rounds that the
// switch answers STALE forever.
void Replies::switch_reset(const std::string& what, bool tag_may_be_new) {
  if (faults_.no_restart_detection) return;  // a simulation took the rule out
  ++stats_.state_resets;
  if (reset_why_.empty())
    reset_why_ = what + ": its state for job " + std::to_string(cfg_.job_id) +
                 " is new (the switch restarted, or the job was removed and added again)";
  rounds_.forget(arrived_, tag_may_be_new);
  rounds_.flag_resync(reset_why_);
  if (!call_) {  // between calls (residual-only or parked packets): nothing to abort
    log_(Log::WARNING, "worker " + std::to_string(cfg_.worker_id) + ": " + reset_why_);
    flights_.drop_all();
    reset_why_.clear();
  }
}

// RESULT and ACK carry the install tag of the switch's state for the job (Rounds::see_tag),
// told apart by when the datagram arrived.
bool Replies::current_state(uint8_t tag, uint32_t i, const char* what, bool counts_flight,
                            double now) {
  switch (rounds_.see_tag(tag, arrived_, !faults_.one_tag_left)) {
    case Rounds::Tag::KNOWN:
      return true;
    case Rounds::Tag::LEFT:  // a late packet of the state before: the replica misses it
      rounds_.flag_resync("a " + std::string(what) + " of the switch's state before its last "
                          "restart or re-install of the job arrived late");
      ++stats_.stray_replies;
      return false;
    case Rounds::Tag::NEW:
      break;
  }
  const int was = rounds_.tag();
  // The new state counted my flight: settled as counted, not forgotten with the others.
  if (counts_flight && !faults_.forget_counted_at_reset) flights_.done(i, true, now, false);
  switch_reset("the switch's " + std::string(what) + " on slot " +
               std::to_string(cfg_.slot_base + i) + " carries install tag " +
               std::to_string(tag) + ", not " + std::to_string(was));
  rounds_.learn_tag(tag);
  return true;
}

// Replies echo the transmission number of the contribution they answer (docs/protocol.md §4).
bool Replies::answers_latest(uint32_t i, uint8_t flags) const {
  const Flight* f = slots_[i].flight.get();
  if (f != nullptr && faults_.ignore_echo) return true;
  return f != nullptr && ((flags & wire::TX_MASK) >> wire::TX_SHIFT) == f->tx;
}

}  // namespace hysync::worker
