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

#include "worker/backend.h"
#include "worker/call.h"
#include "worker/config.h"
#include "worker/faults.h"
#include "worker/flights.h"
#include "worker/keys.h"
#include "worker/log.h"
#include "worker/quantize.h"
#include "worker/replies.h"
#include "worker/results.h"
#include "worker/rounds.h"
#include "worker/slot.h"
#include "worker/stats.h"

namespace hysync::worker {



// PENDING: step() only. RESET: the switch answered from state that is new to this worker (it
// restarted, or the job was installed again); the call aborted as UNREACHABLE's does.
// CLOSED: close() ended the call (aborted as UNREACHABLE's) or refused it before it began.
enum class CallStatus { DONE, UNREACHABLE, INTERRUPTED, PENDING, RESET, CLOSED };

class Engine final {
 public:
  // Over a MemoryBackend a deterministic driver (tests/sim) owns the clock and the network:
  // it drives calls with begin_call / step / on_datagram / tick instead of allreduce.
  // `faults`: rules taken out, for a simulation only (faults.h).
  Engine(const EngineConfig& config, std::unique_ptr<Backend> backend, const Faults& faults = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Keys (keys.h), by name: the engine owns each key's residual from call to call.
  // key_of: the key named `name` of numel elements, registered on first use; a name that comes
  // with another size gets a new chunk range and an empty residual (logged). find_key: the
  // live key named `name`, or -1.
  int key_of(const std::string& name, int64_t numel);
  int find_key(const std::string& name) const { return keys_.find(name); }
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
  // Between calls: serve the socket for `duration` seconds (results, retransmissions).
  CallStatus poll(double duration);
  // The steps of allreduce, for a driver that feeds datagrams itself (the fuzz target): start
  // a call (sends the first window), is every chunk's fate known, finish it (RULE B, output).
  void begin_call(int index, float* values, int64_t numel);
  bool call_done() const;
  void end_call();
  // One received datagram, as the receive loop handles it; timers that fell due by `now`.
  // `arrived`: when it reached the worker (before `now` when it waited to be read).
  void on_datagram(const uint8_t* data, std::size_t size, double now, double arrived) {
    replies_.on_datagram(data, size, now, arrived);
  }
  void tick(double now);
  // One turn of a call's loop at `now` (allreduce runs it between waits): timers, JOINs,
  // sends, the dead check. DONE ends the call (end_call done); UNREACHABLE and RESET abort it;
  // else PENDING, with nothing to do before next_wake() unless a datagram arrives.
  CallStatus step(double now);
  double next_wake() const;
  Backend& backend() { return *io_; }
  // Why the last call aborted with RESET ("" if it did not).
  const std::string& reset_why() const { return replies_.reset_why(); }

  // From any thread, at any time: the call or poll in progress ends at once with CLOSED
  // (aborted: its chunks kept as residual, a resync flagged), and every later one is refused
  // with CLOSED; neither reads nor writes the socket again. Whoever owns the socket closes it
  // once the call has returned (worker/transport.py).
  void close() { io_->close(); }
  bool closed() const { return io_->closed(); }

  // Safe to read from another thread while a call runs.
  bool needs_resync() const { return rounds_.needs_resync(); }
  void clear_resync() { rounds_.clear_resync(); }
  uint64_t missed_results() const { return rounds_.missed_results(); }
  uint64_t bad_datagrams() const { return results_.bad_datagrams(); }
  int in_flight() const { return flights_.in_flight(); }
  EngineStats& stats() { return stats_; }
  void reset_stats() { stats_ = EngineStats(); }
  double srtt() const { return flights_.rto().srtt(); }  // < 0: no sample yet
  double rto() const { return flights_.rto().value(); }
  std::vector<int> slot_modes() const {
    std::vector<int> modes;
    for (const Slot& s : slots_) modes.push_back(s.mode);
    return modes;
  }
  std::string describe_flights() const { return flights_.describe(); }
  const Flight* flight(uint32_t i) const { return slots_.at(i).flight.get(); }  // null: slot idle
  uint32_t window() const { return w_; }
  // Log lines since the last call: (level, message), level 30 = warning, 20 = info.
  std::vector<std::pair<int, std::string>> take_logs() { return log_.take(); }

 private:
  double read_before_timeouts(double now);
  void drain();
  std::size_t receive();  // one batch; returns the messages read (RECEIVE_BATCH: maybe more)
  void abort_call();
  void retire_call();
  void flush() { io_->flush(); }
  double now() const { return io_->now(); }
  bool interrupted(double now);
  bool unheard_since_give_up(double now) const;

  // The parts, each built on those above it. A reply flows backend -> replies -> results and
  // flights; a flight's fate -> keys (RULE B).
  EngineConfig cfg_;
  Faults faults_;
  Quantizer quantizer_;
  std::unique_ptr<Backend> io_;
  uint32_t w_;
  std::vector<Slot> slots_;
  Log log_;
  EngineStats stats_;
  std::unique_ptr<Call> call_;
  std::unique_ptr<Call> spare_call_;  // the last call's, reused by the next (Call::start)
  Keys keys_{cfg_, quantizer_, stats_};
  Rounds rounds_{cfg_, slots_, log_, *io_};
  Results results_{cfg_, quantizer_, keys_, slots_, stats_, log_, call_};
  Flights flights_{cfg_, faults_, quantizer_, *io_, slots_,
                   keys_, rounds_, results_, stats_, call_};
  Replies replies_{cfg_, faults_, *io_, slots_, rounds_, results_, flights_, stats_, log_, call_};
  double gave_up_at_ = -1;  // the last call given up (silent switch, or a packet deadline)
  std::function<bool()> interrupted_;
  double checked_at_ = 0;
};

}  // namespace hysync::worker
