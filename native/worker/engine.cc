// The worker's protocol engine (docs/protocol.md §9): the call itself (allreduce, begin_call,
// step, end_call, abort), poll between calls, and the loop's waits on the backend; what a
// reply means and what a flight does live in the parts it coordinates (engine.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <system_error>

#include "worker/engine.h"
#include "worker/wire_names.h"

namespace hysync::worker {

Engine::Engine(const EngineConfig& config, std::unique_ptr<Backend> backend, const Faults& faults)
    : cfg_(config),
      faults_(faults),
      quantizer_(config.scale, config.members, faults.pin_overflow),
      io_(std::move(backend)),
      w_(config.slot_count),
      slots_(w_) {
  std::mt19937_64 rng(config.seed);
  for (Slot& s : slots_) s.seq = 1 + uint32_t(rng() % (HALF32 - 1));
}

Engine::~Engine() = default;

int Engine::key_of(const std::string& name, int64_t numel) {
  int64_t was = -1;
  const int index = keys_.name_key(name, numel, &was);
  if (was >= 0)
    log_(Log::INFO, "key '" + name + "' changed size " + std::to_string(was) + " -> " +
                        std::to_string(numel) + ": new chunk range; its residual (at most the "
                        "last quantization error in sync) is dropped");
  return index;
}

// ------------------------------------------------------------------ the call
CallStatus Engine::allreduce(int index, float* values, int64_t numel) {
  if (closed()) return CallStatus::CLOSED;
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
    flights_.set_woke_late(std::max(0.0, now() - blocked - delay));
    if (closed()) {
      abort_call();
      return CallStatus::CLOSED;
    }
    if (interrupted(now())) {
      abort_call();
      return CallStatus::INTERRUPTED;
    }
    if (ready) receive();
  }
}

CallStatus Engine::step(double now) {
  if (!call_) return CallStatus::DONE;
  if (call_->remaining > 0) flights_.expire(now);
  if (!replies_.reset_why().empty()) {
    log_(Log::ERROR,
         "worker " + std::to_string(cfg_.worker_id) + " aborts its call: " + replies_.reset_why());
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
    if (flights_.silent_too_long(now) || unheard_since_give_up(now)) {
      log_(Log::ERROR, "worker " + std::to_string(cfg_.worker_id) + " heard nothing for " +
                  std::to_string(cfg_.dead_after) + " s: " + flights_.describe());
      rounds_.flag_resync("nothing heard from the switch while calls carried their chunks");
      flights_.forget_unanswered();
      gave_up_at_ = now;
      return CallStatus::UNREACHABLE;
    }
    return CallStatus::DONE;
  }
  flights_.join_idle_slots(now);
  flush();
  if (flights_.silent_too_long(now) || flights_.waited_too_long(now)) {
    log_(Log::ERROR, "worker " + std::to_string(cfg_.worker_id) +
                " gives up waiting: " + flights_.describe());
    gave_up_at_ = now;
    abort_call();
    return CallStatus::UNREACHABLE;
  }
  return CallStatus::PENDING;
}

// After a call given up, a later call that ends only by carrying is unreachable too while the
// switch has been heard neither since that give-up nor for dead_after (§9 Failures). Not at
// once after a packet deadline: that give-up comes while the switch answers the other slots,
// and a call that then ends by parking meets a round that holds its packet, not a silent
// switch (seed 9068240: a member's call given up on a sync round that waited for a lossy
// straggler; its next call, 44 ms later and 93 ms after the last reply, parked its one chunk
// in a partial round and was failed 'unreachable'). After a give-up on silence the switch was
// unheard for dead_after already, so those calls are unreachable until it is heard, as before.
bool Engine::unheard_since_give_up(double now) const {
  if (gave_up_at_ < 0 || flights_.last_heard() >= gave_up_at_) return false;
  return faults_.unreachable_after_any_give_up ||
         now >= flights_.last_heard() + cfg_.dead_after;
}

void Engine::begin_call(int index, float* values, int64_t numel) {
  rounds_.check_suspects();
  replies_.clear_reset();
  if (spare_call_) {
    call_ = std::move(spare_call_);
    call_->start(index, key(index), values, numel, w_);
  } else {
    call_ = std::make_unique<Call>(index, key(index), values, numel, w_);
  }
  stats_.results.reserve(stats_.results.size() + std::size_t(key(index).chunks) * H);
  flights_.start_call(now());
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
  flights_.forget_unanswered();  // the next call gives the switch dead_after afresh
  flights_.drop_all();
  for (auto& o : c.outcome)
    if (o == Outcome::PENDING) o = Outcome::CARRIED;
  keys_.finish(*call_);
  retire_call();
  rounds_.flag_resync("a call was aborted with contributions in flight");
}

void Engine::tick(double now) {
  flights_.expire(now);
  flush();
}

CallStatus Engine::poll(double duration) {
  const double end = now() + duration;
  double t;
  while ((t = now()) < end) {
    if (closed()) return CallStatus::CLOSED;
    if (interrupted(t)) return CallStatus::INTERRUPTED;
    t = read_before_timeouts(t);
    flights_.expire(t);  // residual-only and parked packets keep retrying
    flush();
    const double wait = std::max(0.0, std::min(end - t, flights_.next_timer() - t));
    const double blocked = now();
    const bool ready = io_->wait(wait);
    flights_.set_woke_late(std::max(0.0, now() - blocked - wait));
    if (ready) receive();
  }
  flights_.set_woke_late(0);
  if (closed()) return CallStatus::CLOSED;
  flush();
  rounds_.check_suspects();
  return CallStatus::DONE;
}

double Engine::next_wake() const { return flights_.next_wake(); }

// A timer due at `now` fires only after the backend was read empty: on a busy machine the
// process wakes long after the replies arrived, and one that waits unread is no loss (its
// retransmission would only add load on the switch). Returns the time after reading.
double Engine::read_before_timeouts(double now) {
  if (flights_.next_timer() > now) return now;
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
    n = io_->receive(replies_);
  } catch (const std::system_error& err) {  // e.g. an ICMP error reported on the socket
    results_.bad(std::string("socket error ") + err.what());
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
