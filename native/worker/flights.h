// Flights and their timers: the one packet in flight per slot, from launch to its outcome -
// what to send next on a slot, sending, retransmission (the RTO, probes into a silent switch),
// parking in partial mode, the JOINs offered to idle slots - and what the switch's silence
// means (dead_after). Replies (replies.h) tell it a flight's fate; it applies RULE B through
// Keys and, for an own contribution counted without its result, the result through Results.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <queue>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/call.h"
#include "worker/config.h"
#include "worker/faults.h"
#include "worker/keys.h"
#include "worker/quantize.h"
#include "worker/results.h"
#include "worker/rounds.h"
#include "worker/rto.h"
#include "worker/slot.h"
#include "worker/stats.h"

namespace hysync::worker {

class Flights {
 public:
  // `call`: the engine's call in progress (null between calls): its chunks are what a slot
  // sends next.
  Flights(const EngineConfig& config, const Faults& faults, const Quantizer& quantizer,
          Backend& io, std::vector<Slot>& slots, Keys& keys, Rounds& rounds, Results& results,
          EngineStats& stats, const std::unique_ptr<Call>& call);

  // A call starts at `now`: a slot held by a parked packet sends it again (hold_queue), then
  // timers that fell due between calls run, and every idle slot sends its first chunk.
  void start_call(double now);
  // Timers that fell due by `now`: retransmissions, probes, parking, STALE grace periods.
  void expire(double now);
  // The call made no progress for join_after: JOINs on its idle slots.
  void join_idle_slots(double now);
  // Forget every packet in flight as not counted (an abort, a new switch state).
  void drop_all();

  // What replies say of slot i's flight (replies.h).
  void heard(double now) { last_rx_ = now; }  // a reply that shows the switch at work
  // Its first transmission closed a round (the RESULT names me): a sample of the path's RTT.
  void path_sample(uint32_t i, double now);
  // A RESULT whose bitmap holds every member: each of them alive and at work then, so the
  // packet deadline counts from here at the earliest (flight_deadline).
  void heard_everyone(double now) { everyone_at_ = now; }
  // Its fate is known (RULE B); `round`: the RESULT of the round a carried flight missed;
  // `progress`: false for an answer that says nothing of the call's progress (join_after).
  void done(uint32_t i, bool included, double now, bool send_next_chunk = true,
            const uint8_t* round = nullptr, bool progress = true);
  // ACK, STALE_COUNTED. `of_state_known`: false for a STALE_COUNTED of a state a reset left
  // since (its grace period ran out after the reset): the round it names teaches no rounds.
  void counted_without_result(uint32_t i, double now, bool of_state_known = true);
  // A STALE reply to its latest transmission: decided after a grace period (or at once for
  // a probe) unless the round's result arrives.
  void stale_reply(uint32_t i, uint8_t reason, uint8_t mode, double now);
  // A relayed STALE_ROUND (docs/protocol.md §11): not counted, final - decided at once as a
  // STALE reply's grace period would decide it (sync: again at the open round; partial: carried).
  void refused(uint32_t i, uint8_t mode, double now);
  // CHUNK_MISMATCH: the open round `rnd` aggregates `chunk`; contribute to it instead.
  void retarget(uint32_t i, uint32_t chunk, uint32_t rnd, uint8_t mode, double now);
  // `at_once`: on a RESEND that answered the slot's JOIN before (not by join_after).
  void offer_join(uint32_t i, double now, bool at_once = false);
  // Round `rnd` of slot i closed with `chunk` (its result applied): in partial, a chunk of the
  // call's key still queued there goes last (least recently closed first), and a chunk of the
  // call that this round displaced is offered again.
  void round_closed(uint32_t i, uint32_t chunk, uint32_t rnd, double now);
  void follow_mode(uint32_t i, double now);  // the slot's mode was reported
  // Its round closed with my bit on another chunk (a packet of mine an aborted call forgot):
  // the switch dropped it there as my duplicate, without a word, or has yet to answer it. Sent
  // again now: the answer (a RESEND, as the round is the slot's last) settles it.
  void closed_by_my_other(uint32_t i, double now);

  // The switch's silence.
  double last_heard() const { return last_rx_; }
  bool silent_too_long(double now) const;
  bool waited_too_long(double now) const;
  double flight_deadline() const;  // when waited_too_long turns true; infinity: never yet
  void forget_unanswered() { unanswered_since_ = -1; }  // dead_after counts afresh
  // How long past its timeout the call's or poll's last wait woke up (expire).
  void set_woke_late(double late) { woke_late_ = late; }
  double next_timer() const;  // infinity: none
  // The first timer, dead_after's silence, a packet's deadline (flight_deadline) or
  // join_after.
  double next_wake() const;

  int in_flight() const { return inflight_; }
  uint64_t call_under_way() const { return calls_; }  // FlightState::call of its flights
  const Rto& rto() const { return rto_; }
  std::string describe() const;

 private:
  struct Timer {
    double at;
    uint64_t gen;
    uint32_t slot;
    bool extended = false;  // re-armed once already because it fired late (expire())
    bool operator>(const Timer& o) const { return at > o.at || (at == o.at && gen > o.gen); }
  };

  // sending
  void order_queue(uint32_t i);
  void reoffer_displaced(uint32_t i, uint32_t rnd, double now);
  void queue_reoffer(uint32_t i, int64_t local);
  void drop_reoffer(uint32_t i, int64_t local);
  void send_next(uint32_t i, double now);
  bool hold_past_sync_copy(uint32_t i, double now);
  void send_chased(uint32_t i, double now);
  void chase(uint32_t i, uint32_t chunk);
  void send_own(uint32_t i, int64_t local, const uint32_t* rnd, double now);
  void send_extra(uint32_t i, Kind kind, int key, uint32_t chunk, uint32_t rnd, double now,
                  bool join = false);
  void launch(uint32_t i, const uint32_t* rnd, double now);
  void transmit(uint32_t i, double now, bool retransmit, bool timeout = true);
  bool holdable(uint32_t i) const;
  uint32_t next_seq(uint32_t i);
  // timers
  bool silent_flight(uint32_t i) const;
  uint32_t longest_silent(uint32_t i) const;
  void decide_stale(uint32_t i, double now);
  // Not counted (a STALE_ROUND's grace period over): sync and async-style again at the open
  // round, partial carried.
  void not_counted(uint32_t i, uint8_t mode, double now);
  void park(uint32_t i);
  void hold_queue(uint32_t i, double now);
  void hurry(uint32_t i, double now);
  void carry_queue(uint32_t i);
  void rtt_sample(uint32_t i, const Flight& f, double now);
  // outcomes
  std::unique_ptr<Flight> new_flight();
  void end_flight(uint32_t i);

  const EngineConfig& cfg_;
  const Faults& faults_;
  const Quantizer& quantizer_;
  Backend& io_;
  std::vector<Slot>& slots_;
  Keys& keys_;
  Rounds& rounds_;
  Results& results_;
  EngineStats& stats_;
  const std::unique_ptr<Call>& call_;
  const uint32_t w_;
  // Per slot: since when the call's chunks there wait (its start, or a reply that put chunks
  // a parked packet held back in the queue, follow_mode): a parked packet they wait behind
  // meets the packet deadline dead_after from then at the earliest (flight_deadline).
  std::vector<double> waits_since_;
  Rto rto_{cfg_};
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  uint64_t gen_ = 0;
  // Ended flights, reused by new_flight(): a call launches one per chunk, and allocating each
  // (most of a kilobyte, freed in bursts of a window) cost a sixth of the engine's CPU in
  // malloc's bins.
  std::vector<std::unique_ptr<Flight>> spare_flights_;
  int inflight_ = 0;
  double progress_at_ = 0, joined_at_ = 0;  // a flight of the call settled; idle slots joined
  uint64_t calls_ = 0;  // calls started: the number of the call under way (FlightState::call)
  double woke_late_ = 0;
  double probed_at_ = 0;  // the last retransmission into a silent switch (expire())
  // Transmissions counted, and the latest one whose flight's fate is known: the flights
  // sent after it have been overtaken by no answer (silent_flight).
  uint64_t sent_seq_ = 0, answered_seq_ = 0;
  double last_rx_;                // the last reply that showed the switch at work
  double unanswered_since_ = -1;  // the first packet sent after last_rx_ (dead_after counts)
  // The last RESULT heard whose bitmap holds every member (heard_everyone).
  double everyone_at_ = -std::numeric_limits<double>::infinity();
};

}  // namespace hysync::worker
