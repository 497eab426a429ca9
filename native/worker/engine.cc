// The worker's protocol engine (docs/protocol.md §9). Method names follow the rules they
// implement; it is a port, rule by rule, of the pure-Python engine that worker/transport.py
// held before (in git history), which the worker and e2e tests were written against.
// This file: construction, logs and the call itself (allreduce, begin_call, step, end_call).
// The rest of Engine, one part a file: io.cc (the socket or in-memory backend, receiving,
// decoding), flights.cc (sending, timers, RTO, parking, JOINs), results.cc (replies and rounds,
// RULE A), residuals.cc (keys and their residuals, RULE B); engine_internal.h, what they share.
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>

#include "worker/engine_internal.h"

namespace hysync::worker {

double monotonic_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

Engine::Engine(const EngineConfig& config, int fd)
    : cfg_(config),
      quantizer_(config.scale, config.members, config.test_only_pin_overflow),
      fd_(fd),
      w_(config.slot_count),
      bit_(1u << config.worker_id),
      next_round_(w_, 0),
      seq_(w_),
      known_(w_, false),
      chased_(w_),
      own_results_(w_),
      mode_(w_, -1),
      tx_number_(w_, 0),
      suspect_(w_),
      acked_(w_),
      flight_(w_),
      rto_(config.rto_initial),
      last_rx_(0),
      rx_(RECV_BATCH, 2048),
      tx_(RECV_BATCH, P) {
  rx_.set_coalescing(fd);    // the switch's GSO runs of results arrive as one buffer each
  tx_.set_segmenting(true);  // every packet goes to the switch, all of one size
  std::mt19937_64 rng(config.seed);
  for (auto& s : seq_) s = 1 + uint32_t(rng() % (HALF32 - 1));
  last_rx_ = now();
}

Engine::~Engine() = default;

void Engine::log(int level, std::string message) {
  if (logs_.size() < 10000) logs_.emplace_back(level, std::move(message));
}

std::vector<std::pair<int, std::string>> Engine::take_logs() {
  std::vector<std::pair<int, std::string>> out;
  out.swap(logs_);
  return out;
}

// ------------------------------------------------------------------ the call
CallStatus Engine::allreduce(int index, float* values, int64_t numel) {
  drain();
  begin_call(index, values, numel);
  for (;;) {
    const CallStatus status = step(read_before_timeouts(now()));
    if (status != CallStatus::PENDING) return status;
    const double delay = std::clamp(next_wake() - now(), 0.0, cfg_.dead_after);
    timespec ts{time_t(delay), long((delay - std::floor(delay)) * 1e9)};
    pollfd p{fd_, POLLIN, 0};
    const double blocked = monotonic_now();
    int ready = ppoll(&p, 1, &ts, nullptr);
    stats_.waited_s += monotonic_now() - blocked;  // nothing to do but wait
    // Woken by a reply or by the timeout, what runs after the deadline (the first timer) ran
    // late by as long as this process then waited for a core.
    woke_late_ = std::max(0.0, monotonic_now() - blocked - delay);
    if (interrupted(monotonic_now())) {
      abort_call();
      return CallStatus::INTERRUPTED;
    }
    if (ready > 0) receive();
  }
}

CallStatus Engine::step(double now) {
  if (!call_) return CallStatus::DONE;
  if (call_->remaining > 0) expire(now);
  if (!reset_why_.empty()) {
    log(40, "worker " + std::to_string(cfg_.worker_id) + " aborts its call: " + reset_why_);
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
      log(40, "worker " + std::to_string(cfg_.worker_id) + " heard nothing for " +
                  std::to_string(cfg_.dead_after) + " s: " + describe_flights());
      flag_resync("nothing heard from the switch while calls carried their chunks");
      unanswered_since_ = -1;
      gave_up_at_ = now;
      return CallStatus::UNREACHABLE;
    }
    return CallStatus::DONE;
  }
  join_idle_slots(now);
  flush();
  if (silent_too_long(now) || waited_too_long(now)) {
    log(40, "worker " + std::to_string(cfg_.worker_id) +
                " gives up waiting: " + describe_flights());
    gave_up_at_ = now;
    abort_call();
    return CallStatus::UNREACHABLE;
  }
  return CallStatus::PENDING;
}

void Engine::begin_call(int index, float* values, int64_t numel) {
  check_suspects();
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
    if (!flight_[i])
      send_next(i, t);
    else if (flight_[i]->parked)
      hold_queue(i, t);
  }
}

bool Engine::call_done() const { return !call_ || call_->remaining == 0; }

void Engine::end_call() {
  flush();
  finish();
  retire_call();
}

void Engine::retire_call() { spare_call_ = std::move(call_); }

void Engine::tick(double now) {
  expire(now);
  flush();
}

bool Engine::interrupted(double now) {
  if (!interrupted_ || now - checked_at_ < 0.1) return false;
  checked_at_ = now;
  return interrupted_();
}

}  // namespace hysync::worker
