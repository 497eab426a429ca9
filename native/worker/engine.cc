// The worker's protocol engine (docs/protocol.md §9); method names follow the rules they
// implement. This file: construction and the call itself (allreduce, begin_call, step,
// end_call, abort), poll between calls, and the loop's waits on the backend.
// The engine's parts, one a file:
//   backend.h/.cc   I/O: the UDP socket or the in-memory backend, and the clock
//   flights.cc      flights and timers: sending, retransmission, parking, JOINs (Engine);
//                   rto.h/.cc, the retransmission timeout; flight.h, slot.h, what they hold
//   results.cc      replies and results: what RESULT, RESYNC and ACK mean for a flight and
//                   the replica (Engine); rounds.h/.cc, RULE A and the install tag
//   keys.h/.cc      keys and residuals: chunk ranges, the output, RULE B; call.h, the call
//   config.h        the configuration and its defaults; faults.h, a simulation's faults
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <system_error>

#include "worker/engine_internal.h"

namespace hysync::worker {

Engine::Engine(const EngineConfig& config, std::unique_ptr<Backend> backend, const Faults& faults)
    : cfg_(config),
      faults_(faults),
      quantizer_(config.scale, config.members, faults.pin_overflow),
      io_(std::move(backend)),
      w_(config.slot_count),
      bit_(1u << config.worker_id),
      slots_(w_),
      last_rx_(0) {
  std::mt19937_64 rng(config.seed);
  for (Slot& s : slots_) s.seq = 1 + uint32_t(rng() % (HALF32 - 1));
  last_rx_ = now();
}

Engine::~Engine() = default;

// ------------------------------------------------------------------ the call
CallStatus Engine::allreduce(int index, float* values, int64_t numel) {
  drain();
  begin_call(index, values, numel);
  for (;;) {
    const CallStatus status = step(read_before_timeouts(now()));
    if (status != CallStatus::PENDING) return status;
    const double delay = std::clamp(next_wake() - now(), 0.0, cfg_.dead_after);
    const double blocked = now();
    const bool ready = io_->wait(delay);
    stats_.waited_s += now() - blocked;  // nothing to do but wait
    // Woken by a reply or by the timeout, what runs after the deadline (the first timer) ran
    // late by as long as this process then waited for a core.
    woke_late_ = std::max(0.0, now() - blocked - delay);
    if (interrupted(now())) {
      abort_call();
      return CallStatus::INTERRUPTED;
    }
    if (ready) receive();
  }
}

CallStatus Engine::step(double now) {
  if (!call_) return CallStatus::DONE;
  if (call_->remaining > 0) expire(now);
  if (!reset_why_.empty()) {
    log_(Log::ERROR,
         "worker " + std::to_string(cfg_.worker_id) + " aborts its call: " + reset_why_);
    abort_call();
    return CallStatus::RESET;
  }
  if (call_->remaining == 0) {  // residual-only packets may stay in flight into the next call
    end_call();
    // Done, but maybe only by carrying and parking: in partial mode a call settles a packet
    // that meets silence as counted and carries the slot's chunks, so calls end within an RTO
    // against a switch that answers nothing at all (one restarted without the job). That
    // switch must still be reported, not trained against with nothing aggregated: once
    // dead_after has passed, and at the end of every later call until it is heard again.
    if (silent_too_long(now) || (gave_up_at_ >= 0 && last_rx_ < gave_up_at_)) {
      log_(Log::ERROR, "worker " + std::to_string(cfg_.worker_id) + " heard nothing for " +
                  std::to_string(cfg_.dead_after) + " s: " + describe_flights());
      rounds_.flag_resync("nothing heard from the switch while calls carried their chunks");
      unanswered_since_ = -1;
      gave_up_at_ = now;
      return CallStatus::UNREACHABLE;
    }
    return CallStatus::DONE;
  }
  join_idle_slots(now);
  flush();
  if (silent_too_long(now) || waited_too_long(now)) {
    log_(Log::ERROR, "worker " + std::to_string(cfg_.worker_id) +
                " gives up waiting: " + describe_flights());
    gave_up_at_ = now;
    abort_call();
    return CallStatus::UNREACHABLE;
  }
  return CallStatus::PENDING;
}

void Engine::begin_call(int index, float* values, int64_t numel) {
  rounds_.check_suspects();
  reset_why_.clear();
  if (spare_call_) {
    call_ = std::move(spare_call_);
    call_->start(index, key(index), values, numel, w_);
  } else {
    call_ = std::make_unique<Call>(index, key(index), values, numel, w_);
  }
  const double t = now();
  progress_at_ = call_start_ = t;
  woke_late_ = 0;  // timers that fell due between calls were not waited for
  stats_.results.reserve(stats_.results.size() + std::size_t(key(index).chunks) * H);
  // Timers that fell due between calls first: a call whose every slot is held by a parked
  // packet carries all its chunks at once and never waits for a reply, so a STALE reply's
  // grace period would otherwise never end (the worker falls silent).
  expire(t);
  for (uint32_t i = 0; i < w_; ++i) {
    if (!slots_[i].flight)
      send_next(i, t);
    else if (slots_[i].flight->parked)
      hold_queue(i, t);
  }
}

bool Engine::call_done() const { return !call_ || call_->remaining == 0; }

void Engine::end_call() {
  flush();
  keys_.finish(*call_);
  retire_call();
}

void Engine::retire_call() { spare_call_ = std::move(call_); }

// The call failed: forget what is in flight. Its outcome is unknown, so the chunks keep their
// full value as residual and the replica must resynchronize.
void Engine::abort_call() {
  Call& c = *call_;
  unanswered_since_ = -1;  // the next call gives the switch dead_after afresh
  drop_flights();
  for (auto& o : c.outcome)
    if (o == Outcome::PENDING) o = Outcome::CARRIED;
  keys_.finish(*call_);
  retire_call();
  rounds_.flag_resync("a call was aborted with contributions in flight");
}

void Engine::tick(double now) {
  expire(now);
  flush();
}

CallStatus Engine::poll(double duration) {
  const double end = now() + duration;
  double t;
  while ((t = now()) < end) {
    if (interrupted(t)) return CallStatus::INTERRUPTED;
    t = read_before_timeouts(t);
    expire(t);  // residual-only and parked packets keep retrying
    flush();
    double wait = end - t;
    if (!timers_.empty()) wait = std::min(wait, timers_.top().at - t);
    wait = std::max(0.0, wait);
    const double blocked = now();
    const bool ready = io_->wait(wait);
    woke_late_ = std::max(0.0, now() - blocked - wait);
    if (ready) receive();
  }
  woke_late_ = 0;
  flush();
  rounds_.check_suspects();
  return CallStatus::DONE;
}

// How long the switch has been silent while this worker waited on it: since the first packet
// sent after the last reply heard (not since that reply: a worker computing between calls sends
// nothing and waits on nothing).
// Written as next_wake() writes the deadline: the same floating-point sum.
bool Engine::silent_too_long(double now) const {
  return unanswered_since_ > last_rx_ && now >= unanswered_since_ + cfg_.dead_after;
}

// A packet of this call has waited dead_after since it was launched while replies to others
// kept silent_too_long from firing: a round latched in sync (or a partial quorum) that waits
// for a member who is gone, on a slot of a job whose other slots run async since
// (docs/protocol.md §9 Failures). The call gives up as it does on silence. Parked packets are
// settled already. A packet of another kind that holds a slot while a chunk of the call
// waits behind it counts too: a JOIN of zeros that joined such a round keeps the call's own
// chunk from ever leaving, so no packet of the call would otherwise be launched to wait.
bool Engine::waited_too_long(double now) const {
  if (!call_ || faults_.no_flight_deadline) return false;
  for (uint32_t i = 0; i < w_; ++i) {
    const Flight* f = slots_[i].flight.get();
    if (!f || f->parked || now < f->launched + cfg_.dead_after) continue;
    const bool own = f->kind == Kind::OWN && f->key == call_->key;
    const bool blocks = !faults_.own_flight_deadline && !call_->queues[i].empty();
    if (own || blocks) return true;
  }
  return false;
}

double Engine::next_wake() const {
  double at = unanswered_since_ > last_rx_ ? unanswered_since_ + cfg_.dead_after
                                           : std::numeric_limits<double>::infinity();
  if (!timers_.empty()) at = std::min(at, timers_.top().at);
  if (call_) at = std::min(at, std::max(progress_at_, joined_at_) + cfg_.join_after);
  return at;
}

void Engine::flush() { io_->flush(); }

// A timer due at `now` fires only after the backend was read empty: on a busy machine the
// process wakes long after the replies arrived, and one that waits unread is no loss (its
// retransmission would only add load on the switch). Returns the time after reading.
double Engine::read_before_timeouts(double now) {
  if (timers_.empty() || timers_.top().at > now) return now;
  drain();
  return this->now();
}

void Engine::drain() {
  while (receive() == Backend::RECEIVE_BATCH) {
  }
}

std::size_t Engine::receive() {
  std::size_t n;
  try {
    n = io_->receive(*this);
  } catch (const std::system_error& err) {  // e.g. an ICMP error reported on the socket
    bad(std::string("socket error ") + err.what());
    return 0;
  }
  if (n) flush();
  return n;
}

bool Engine::interrupted(double now) {
  if (!interrupted_ || now - checked_at_ < 0.1) return false;
  checked_at_ = now;
  return interrupted_();
}

}  // namespace hysync::worker
