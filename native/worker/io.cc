// The worker engine's I/O (engine_internal.h; the engine is described in engine.cc): the
// socket or the in-memory backend, recvmmsg / sendmmsg batches, decoding datagrams, poll between
// calls, and when the call's loop next wakes or gives up on a silent switch.
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "worker/engine_internal.h"

namespace hysync::worker {

namespace {

constexpr uint64_t LOG_EVERY = 1000;  // after the first few, log one bad datagram in this many

}  // namespace

const char* op_name(uint8_t op) { return wire::name(wire::Op(op)); }

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

// How long the switch has been silent while this worker waited on it: since the first packet
// sent after the last reply heard (not since that reply: a worker computing between calls sends
// nothing and waits on nothing).
// Written as next_wake() writes the deadline: the same floating-point sum.
bool Engine::silent_too_long(double now) const {
  return unanswered_since_ > last_rx_ && now >= unanswered_since_ + cfg_.dead_after;
}

// A packet of this call has waited dead_after for its round while replies to others kept
// silent_too_long from firing: a round latched in sync (or a partial quorum) that waits for
// a member who is gone, on a slot of a job whose other slots run async since (docs/protocol.md
// §9 Failures). The call gives up as it does on silence. Parked packets are settled already.
bool Engine::waited_too_long(double now) const {
  if (!call_ || cfg_.test_only_no_flight_deadline) return false;
  for (uint32_t i = 0; i < w_; ++i) {
    const Flight* f = flight_[i].get();
    if (f && f->kind == Kind::OWN && f->key == call_->key && !f->parked &&
        now >= f->launched + cfg_.dead_after)
      return true;
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

std::vector<std::vector<uint8_t>> Engine::take_sent() {
  std::vector<std::vector<uint8_t>> out;
  out.swap(outbox_);
  return out;
}

CallStatus Engine::poll(double duration) {
  if (fd_ < 0) return CallStatus::DONE;  // a driver of the in-memory backend ticks instead
  const double end = monotonic_now() + duration;
  double now;
  while ((now = monotonic_now()) < end) {
    if (interrupted(now)) return CallStatus::INTERRUPTED;
    now = read_before_timeouts(now);
    expire(now);  // residual-only and parked packets keep retrying
    flush();
    double wait = end - now;
    if (!timers_.empty()) wait = std::min(wait, timers_.top().at - now);
    wait = std::max(0.0, wait);
    timespec ts{time_t(wait), long((wait - std::floor(wait)) * 1e9)};
    pollfd p{fd_, POLLIN, 0};
    const double blocked = monotonic_now();
    const int ready = ppoll(&p, 1, &ts, nullptr);
    woke_late_ = std::max(0.0, monotonic_now() - blocked - wait);
    if (ready > 0) receive();
  }
  woke_late_ = 0;
  flush();
  check_suspects();
  return CallStatus::DONE;
}

void Engine::flush() {
  if (fd_ >= 0 && tx_.size()) tx_.flush(fd_);
}

// ------------------------------------------------------------------ receiving
// A timer due at `now` fires only after the socket was read empty: on a busy machine the
// process wakes long after the replies arrived, and one that waits unread is no loss (its
// retransmission would only add load on the switch). Returns the time after reading.
double Engine::read_before_timeouts(double now) {
  if (fd_ < 0 || timers_.empty() || timers_.top().at > now) return now;
  drain();
  return monotonic_now();
}

void Engine::drain() {
  while (receive() == RECV_BATCH) {
  }
}

std::size_t Engine::receive() {
  std::size_t n;
  try {
    n = rx_.receive(fd_);
  } catch (const std::system_error& err) {  // e.g. an ICMP error reported on the socket
    bad(std::string("socket error ") + err.what());
    return 0;
  }
  const double now = monotonic_now();
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t size = rx_.truncated(j) ? rx_.max_bytes() + 1 : rx_.length(j);
    on_datagram(rx_.data(j), size, now);
  }
  if (n) flush();
  return rx_.messages();
}

void Engine::on_datagram(const uint8_t* data, std::size_t size, double now) {
  if (size == P)
    on_full(data, now);
  else
    on_short(data, size, now);
}

void Engine::bad(const std::string& reason) {
  ++bad_datagrams_;
  ++stats_.bad_datagrams;
  if (bad_datagrams_ <= 10 || bad_datagrams_ % LOG_EVERY == 0)
    log(30, "worker " + std::to_string(cfg_.worker_id) + " ignored a datagram (" +
                std::to_string(bad_datagrams_) + " so far): " + reason);
}

}  // namespace hysync::worker
