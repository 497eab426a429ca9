// The worker's transport engine: the whole protocol of docs/protocol.md §9 (RULE A / RULE B,
// sync / partial / async, parking, resync tracking); worker/transport.py is its Python face.
// One thread calls it at a time, without the GIL: it touches no Python object. Python keeps the
// meaning (configuration, keys by name, errors, logs, CallStats).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "hysync_wire.h"
#include "worker/backend.h"
#include "worker/config.h"
#include "worker/faults.h"
#include "worker/keys.h"
#include "worker/quantize.h"
#include "worker/rounds.h"
#include "worker/rto.h"
#include "worker/slot.h"

namespace hysync::worker {

struct Call;

// What one call (or one poll between calls) did: CallStats' counters.
struct EngineStats {
  uint64_t included = 0, carried = 0, residual_contribs = 0, null_contribs = 0, own_applied = 0,
           retransmits = 0, parked = 0, parked_missed = 0, acks = 0, duplicate_results = 0,
           stray_replies = 0, bad_datagrams = 0, joins = 0;
  uint64_t uneven_results = 0;  // results applied that are not a sync round of every member
  uint64_t resent = 0;  // parked packets sent again without a timeout (hurry, parking)
  uint64_t resyncs[5] = {0, 0, 0, 0, 0};  // by ResyncReason
  double waited_s = 0;  // blocked until the switch replied (or a timer fell due)
  QuantStats quant;
  std::vector<uint8_t> results;  // the header of every result applied, HEADER_BYTES each
  // Sentinels of mine absorbed by a non-finite round (settle(), prepare_chunk()): chunk * 64 +
  // lane each (the simulation's books; CallStats counts them).
  std::vector<uint64_t> absorbed;
};


// PENDING: step() only. RESET: the switch answered from state that is new to this worker (it
// restarted, or the job was installed again); the call aborted as UNREACHABLE's does.
enum class CallStatus { DONE, UNREACHABLE, INTERRUPTED, PENDING, RESET };

class Engine final : public DatagramSink {
 public:
  // Over a MemoryBackend a deterministic driver (tests/sim) owns the clock and the network:
  // it drives calls with begin_call / step / on_datagram / tick instead of allreduce.
  // `faults`: rules taken out, for a simulation only (faults.h).
  Engine(const EngineConfig& config, std::unique_ptr<Backend> backend, const Faults& faults = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Keys (keys.h): register returns the key's index, the next chunk range.
  int register_key(int64_t numel) { return keys_.add_key(numel); }
  void retire_key(int index) { keys_.retire(index); }  // its name now maps to another range
  Key& key(int index) { return keys_.at(index); }
  int key_count() const { return keys_.count(); }

  // Contribute `values` (numel float32) under key `index`; the output (what was applied for the
  // key) replaces them in place. UNREACHABLE: nothing heard for dead_after; the call's chunks
  // are kept as residual and the replica needs a resync.
  CallStatus allreduce(int index, float* values, int64_t numel);
  // Asked about ten times a second while a call or a poll waits; true ends it (the call as
  // UNREACHABLE's abort does, returning INTERRUPTED): how Ctrl-C reaches a long native call.
  void set_interrupt_check(std::function<bool()> check) { interrupted_ = std::move(check); }
  // What was applied for a key since its last call, into out (numel floats); zeroes it.
  void take(int index, float* out) { keys_.take(index, out); }
  // For a caller that owns a key's residual between its calls (worker/ddp_hook.py's state, which
  // pickles it): give_residual adds `in` (numel floats) into the key's residual before a call,
  // export_residual moves it into `out` after one (the engine keeps zeros). Residual-only packets
  // still in flight add back into the engine's copy, which the next give/export pair carries; one
  // sent for the key between its calls carries only that copy (what the owner holds rides on the
  // key's next call instead: later, never lost).
  void give_residual(int index, const float* in) { keys_.give_residual(index, in); }
  void export_residual(int index, float* out) { keys_.export_residual(index, out); }
  // Between calls: serve the socket for `duration` seconds (results, retransmissions).
  CallStatus poll(double duration);
  // The steps of allreduce, for a driver that feeds datagrams itself (the fuzz target): start
  // a call (sends the first window), is every chunk's fate known, finish it (RULE B, output).
  void begin_call(int index, float* values, int64_t numel);
  bool call_done() const;
  void end_call();
  // One received datagram, as the receive loop handles it; timers that fell due by `now`.
  void on_datagram(const uint8_t* data, std::size_t size, double now) override;
  void tick(double now);
  // One turn of a call's loop at `now` (allreduce runs it between waits): timers, JOINs,
  // sends, the dead check. DONE ends the call (end_call done); UNREACHABLE and RESET abort it;
  // else PENDING, with nothing to do before next_wake() unless a datagram arrives.
  CallStatus step(double now);
  double next_wake() const;
  Backend& backend() { return *io_; }
  // Why the last call aborted with RESET ("" if it did not).
  const std::string& reset_why() const { return reset_why_; }

  // Safe to read from another thread while a call runs.
  bool needs_resync() const { return rounds_.needs_resync(); }
  void clear_resync() { rounds_.clear_resync(); }
  uint64_t missed_results() const { return rounds_.missed_results(); }
  uint64_t bad_datagrams() const { return bad_datagrams_; }
  int in_flight() const { return inflight_; }
  EngineStats& stats() { return stats_; }
  void reset_stats() { stats_ = EngineStats(); }
  double srtt() const { return rto_.srtt(); }  // < 0: no sample yet
  double rto() const { return rto_.value(); }
  std::vector<int> slot_modes() const {
    std::vector<int> modes;
    for (const Slot& s : slots_) modes.push_back(s.mode);
    return modes;
  }
  std::string describe_flights() const;
  const Flight* flight(uint32_t i) const { return slots_.at(i).flight.get(); }  // null: slot idle
  uint32_t window() const { return w_; }
  // Log lines since the last call: (level, message), level 30 = warning, 20 = info.
  std::vector<std::pair<int, std::string>> take_logs() { return log_.take(); }

 private:
  struct Timer {
    double at;
    uint64_t gen;
    uint32_t slot;
    bool extended = false;  // re-armed once already because it fired late (expire())
    bool operator>(const Timer& o) const { return at > o.at || (at == o.at && gen > o.gen); }
  };

  // receiving
  double read_before_timeouts(double now);
  void drain();
  std::size_t receive();  // one batch; returns the messages read (RECEIVE_BATCH: maybe more)
  void bad(const std::string& reason);
  void on_full(const uint8_t* d, double now);
  void on_short(const uint8_t* d, std::size_t size, double now);
  void on_ack(uint32_t i, uint32_t rnd, uint32_t chunk, double now);
  void on_resync(uint32_t i, uint8_t reason, uint32_t rnd, uint32_t chunk, uint8_t mode,
                 uint32_t count, uint8_t flags, double now);
  bool answers_latest(uint32_t i, uint8_t flags) const;
  bool seen_own_result(uint32_t i, const uint8_t* d) const;
  void keep_own_result(uint32_t i, const uint8_t* d);
  void decide_stale(uint32_t i, double now);
  void counted_without_result(uint32_t i, double now);
  void retarget(uint32_t i, uint32_t chunk, uint32_t rnd, uint8_t mode, double now);
  void apply(const uint8_t* d);
  void apply_result(uint32_t chunk, const double* avg);
  double divisor(uint8_t mode, uint8_t count) const;
  double lane_share(int32_t sum, double share) const;
  // sending
  void send_next(uint32_t i, double now);
  void send_chased(uint32_t i, double now);
  void chase(uint32_t i, uint32_t chunk);
  void send_own(uint32_t i, int64_t local, const uint32_t* rnd, double now);
  void send_extra(uint32_t i, Kind kind, int key, uint32_t chunk, uint32_t rnd, double now,
                  bool join = false);
  void join_idle_slots(double now);
  void offer_join(uint32_t i, double now);
  void launch(uint32_t i, const uint32_t* rnd, double now);
  void transmit(uint32_t i, double now, bool retransmit, bool timeout = true);
  bool holdable(uint32_t i) const;
  void flush();
  uint32_t next_seq(uint32_t i);
  // timers
  void expire(double now);
  bool silent_flight(uint32_t i) const;
  uint32_t longest_silent(uint32_t i) const;
  void park(uint32_t i);
  void hold_queue(uint32_t i, double now);
  void hurry(uint32_t i, double now);
  void follow_mode(uint32_t i, double now);
  void carry_queue(uint32_t i);
  void rtt_sample(uint32_t i, const Flight& f, double now);
  // outcomes (RULE B)
  // `round`: the RESULT of the very round a carried flight missed (same slot, round and
  // chunk), whose lanes absorb the flight's sentinels where its sum is non-finite already.
  void done(uint32_t i, bool included, double now, bool send_next_chunk = true,
            const uint8_t* round = nullptr);
  std::unique_ptr<Flight> new_flight();
  void end_flight(uint32_t i);
  void apply_own(uint32_t i);
  void abort_call();
  void retire_call();
  void drop_flights();

  EngineConfig cfg_;
  Faults faults_;
  Quantizer quantizer_;
  std::unique_ptr<Backend> io_;
  uint32_t w_, bit_;
  std::vector<Slot> slots_;
  Log log_;
  Rounds rounds_{cfg_, slots_, log_, *io_};
  double progress_at_ = 0, joined_at_ = 0;  // a flight of the call settled; idle slots joined
  // The entry of slots_[i].acked that an async RESULT d (count 1, my bit) answers, or end().
  std::deque<Acked>::iterator acked_entry(uint32_t i, const uint8_t* d);
  // Ended flights, reused by new_flight(): a call launches one per chunk, and allocating each
  // (most of a kilobyte, freed in bursts of a window) cost a sixth of the engine's CPU in
  // malloc's bins.
  std::vector<std::unique_ptr<Flight>> spare_flights_;
  int inflight_ = 0;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  uint64_t gen_ = 0;
  Rto rto_{cfg_};
  double woke_late_ = 0;  // how long past its timeout the call's or poll's last wait woke up
  double probed_at_ = 0;  // the last retransmission into a silent switch (expire())
  // Transmissions counted, and the latest one whose flight's fate is known: the flights
  // sent after it have been overtaken by no answer (silent_flight).
  uint64_t sent_seq_ = 0, answered_seq_ = 0;
  uint64_t bad_datagrams_ = 0;
  std::unique_ptr<Call> call_;
  std::unique_ptr<Call> spare_call_;  // the last call's, reused by the next (Call::start)
  EngineStats stats_;
  Keys keys_{cfg_, quantizer_, stats_};  // after what it refers to
  double last_rx_;
  std::function<bool()> interrupted_;
  double checked_at_ = 0;
  bool interrupted(double now);
  double now() const { return io_->now(); }
  void switch_reset(const std::string& what);
  // RESULT and ACK carry the install tag of the switch's state for the job: false for a
  // packet of a state this worker has left (a new tag resets, see switch_reset).
  bool current_state(uint8_t tag, uint32_t i, const char* what, double now);
  bool silent_too_long(double now) const;
  bool waited_too_long(double now) const;
  double call_start_ = 0;
  double unanswered_since_ = -1;  // the first packet sent after last_rx_ (dead_after counts)
  double gave_up_at_ = -1;        // the last call given up on a silent switch
  std::string reset_why_;  // set when a reply shows the switch's state is new; ends the call
};

}  // namespace hysync::worker
