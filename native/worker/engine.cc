// The worker's protocol engine (docs/protocol.md §9). Method names follow the rules they
// implement; it is a port, rule by rule, of the pure-Python engine that worker/transport.py
// held before (in git history), which the worker and e2e tests were written against.
#include "worker/engine.h"

#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <system_error>

#include "common/bytes.h"

namespace hysync::worker {

namespace {

constexpr std::size_t H = wire::HEADER_BYTES;
constexpr std::size_t RECV_BATCH = 256;     // messages read per wake-up (a coalesced one: a run)
constexpr double SUSPECT_MEMORY = 60.0;     // seconds a suspected round may still arrive
constexpr uint32_t MAX_SUSPECT_GAP = 4096;  // more skipped rounds on one slot: don't list them
constexpr std::size_t ACK_MEMORY = 64;      // own ACKed contributions remembered per slot
constexpr uint64_t LOG_EVERY = 1000;  // after the first few, log one bad datagram in this many
// Results held for chunk ids no key owns yet (a peer registered a key first): at most this
// many chunks (32 MiB); beyond, garbage could grow them without bound.
constexpr std::size_t MAX_ORPHANS = 65536;
constexpr uint32_t HALF32 = 1u << 31;
constexpr uint8_t SYNC = uint8_t(wire::Mode::SYNC), PARTIAL = uint8_t(wire::Mode::PARTIAL),
                  ASYNC = uint8_t(wire::Mode::ASYNC);
constexpr uint8_t STALE_ROUND = uint8_t(wire::ResyncReason::STALE_ROUND),
                  CHUNK_MISMATCH = uint8_t(wire::ResyncReason::CHUNK_MISMATCH),
                  STALE_COUNTED = uint8_t(wire::ResyncReason::STALE_COUNTED),
                  NOT_JOINED = uint8_t(wire::ResyncReason::NOT_JOINED);
constexpr uint8_t TX_NUMBERS = wire::TX_MASK >> wire::TX_SHIFT;  // 31: numbers wrap mod 32

struct Header {
  uint8_t version, op, flags, mode, worker_id, count, reason;
  uint16_t job_id, slot;
  uint32_t round, chunk, bitmap;
  explicit Header(const uint8_t* d)
      : version(d[wire::OFF_VERSION]), op(d[wire::OFF_OP]), flags(d[wire::OFF_FLAGS]),
        mode(d[wire::OFF_MODE]), worker_id(d[wire::OFF_WORKER_ID]), count(d[wire::OFF_COUNT]),
        reason(d[wire::OFF_REASON]), job_id(load_be16(d + wire::OFF_JOB_ID)),
        slot(load_be16(d + wire::OFF_SLOT)), round(load_be32(d + wire::OFF_ROUND)),
        chunk(load_be32(d + wire::OFF_CHUNK)), bitmap(load_be32(d + wire::OFF_BITMAP)) {}
};

const char* op_name(uint8_t op) {
  switch (op) {
    case 1: return "CONTRIB";
    case 2: return "RESULT";
    case 3: return "RESYNC";
    case 4: return "ACK";
    default: return "?";
  }
}

// Why a datagram does not decode (hysync.wire.Packet.decode's messages), or "" if it does.
std::string decode_error(const uint8_t* d, std::size_t size) {
  if (size < H)
    return "HySync header needs " + std::to_string(H) + " bytes, got " + std::to_string(size);
  const uint8_t version = d[wire::OFF_VERSION], op = d[wire::OFF_OP];
  if (version != wire::VERSION)
    return "HySync version " + std::to_string(version) + ", this build speaks " +
           std::to_string(wire::VERSION);
  const bool full = op == 1 || op == 2;
  if (!full && op != 3 && op != 4) return "unknown HySync op " + std::to_string(op);
  const std::size_t want = full ? P : H;
  if (size != want)
    return std::string(op_name(op)) + " must be " + std::to_string(want) + " bytes, got " +
           std::to_string(size);
  return "";
}

bool ahead(uint32_t a, uint32_t b) { return uint32_t(a - b) < HALF32; }  // a >= b, mod 2^32

// A RESULT's round, chunk (contiguous in the header) and lanes, as last_own_result_ keeps them.
bool same_result(const std::array<uint8_t, 8 + 4 * LANES>& kept, const uint8_t* d) {
  return std::memcmp(kept.data(), d + wire::OFF_ROUND, 8) == 0 &&
         std::memcmp(kept.data() + 8, d + H, 4 * LANES) == 0;
}

void keep_result(std::array<uint8_t, 8 + 4 * LANES>& kept, const uint8_t* d) {
  std::memcpy(kept.data(), d + wire::OFF_ROUND, 8);
  std::memcpy(kept.data() + 8, d + H, 4 * LANES);
}

}  // namespace

double monotonic_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

int32_t Flight::lane(std::size_t j) const { return int32_t(load_be32(&data[H + 4 * j])); }

// The padding lanes past numel hold zeros by construction (zeros are quantized there), so only
// numel floats cross.
void Engine::give_residual(int index, const float* in) {
  Key& reg = key(index);
  for (int64_t j = 0; j < reg.numel; ++j) reg.residual[std::size_t(j)] += in[j];
}

void Engine::export_residual(int index, float* out) {
  Key& reg = key(index);
  std::copy(reg.residual.begin(), reg.residual.begin() + reg.numel, out);
  std::fill(reg.residual.begin(), reg.residual.begin() + reg.numel, 0.0f);
}

// ------------------------------------------------------------------ the call
struct Engine::Call {
  int key;
  float* values;  // the gradient; a chunk's rows become its output once it is prepared
  int64_t numel;
  std::vector<Outcome> outcome;
  std::vector<uint8_t> prepared;  // quantized: residual holds its error, values its output
  std::vector<std::deque<int64_t>> queues;  // per slot: local chunks still to send
  int64_t remaining;
  std::vector<std::vector<int64_t>> held;  // per slot: carried because a parked packet held it
  // Prepared chunks sent back to their queue (sync CHUNK_MISMATCH): their lanes and error.
  std::unordered_map<int64_t, std::pair<std::array<int32_t, LANES>, std::array<float, LANES>>>
      requeued;

  Call(int k, const Key& reg, float* v, int64_t n, uint32_t window)
      : key(k), values(v), numel(n), outcome(std::size_t(reg.chunks), Outcome::PENDING),
        prepared(std::size_t(reg.chunks), 0), queues(window), remaining(reg.chunks),
        held(window) {
    for (uint32_t i = 0; i < window; ++i) {
      // Local chunk l goes to slot (first + l) % W: every W-th chunk from its start.
      int64_t start = (int64_t(i) - int64_t(reg.first % window) + window) % window;
      for (int64_t l = start; l < reg.chunks; l += window) queues[i].push_back(l);
    }
  }
  // Local index of global `chunk` if it waits in slot i's queue, else -1.
  int64_t pending(const Key& reg, uint32_t chunk, uint32_t i) const {
    int64_t local = int64_t(chunk) - int64_t(reg.first);
    if (local < 0 || local >= reg.chunks || outcome[std::size_t(local)] != Outcome::PENDING)
      return -1;
    const auto& q = queues[i];
    return std::find(q.begin(), q.end(), local) != q.end() ? local : -1;
  }
  std::size_t lanes_of(int64_t local) const {  // elements of `values` in this chunk
    return std::size_t(std::clamp<int64_t>(numel - local * int64_t(LANES), 0, LANES));
  }
};

Engine::Engine(const EngineConfig& config, int fd)
    : cfg_(config),
      quantizer_(config.scale, config.members),
      fd_(fd),
      w_(config.slot_count),
      bit_(1u << config.worker_id),
      next_round_(w_, 0),
      seq_(w_),
      known_(w_, false),
      last_own_result_(w_),
      mode_(w_, -1),
      tx_number_(w_, 0),
      rejoin_at_(w_, std::numeric_limits<double>::infinity()),
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

// ------------------------------------------------------------------ keys
int Engine::register_key(int64_t numel) {
  auto reg = std::make_unique<Key>();
  reg->numel = numel;
  reg->chunks = std::max<int64_t>(1, (numel + int64_t(LANES) - 1) / int64_t(LANES));
  reg->first = uint32_t(next_chunk_);
  reg->residual.assign(std::size_t(reg->chunks) * LANES, 0.0f);
  next_chunk_ += reg->chunks;
  for (auto it = orphans_.begin(); it != orphans_.end();) {
    if (it->first >= reg->first && int64_t(it->first) < next_chunk_) {
      if (reg->acc.empty()) reg->acc.assign(reg->residual.size(), 0.0f);
      float* row = &reg->acc[std::size_t(it->first - reg->first) * LANES];
      for (std::size_t j = 0; j < LANES; ++j) row[j] += float(it->second[j] / cfg_.scale);
      it = orphans_.erase(it);
    } else {
      ++it;
    }
  }
  starts_.push_back(reg->first);
  keys_.push_back(std::move(reg));
  return int(keys_.size()) - 1;
}

void Engine::retire_key(int index) { key(index).alive = false; }

int Engine::key_of(uint32_t chunk) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), chunk);
  if (it == starts_.begin()) return -1;
  int pos = int(it - starts_.begin()) - 1;
  const Key& reg = *keys_[std::size_t(pos)];
  if (int64_t(chunk) >= int64_t(reg.first) + reg.chunks) return -1;
  return pos;
}

void Engine::take(int index, float* out) {
  Key& reg = key(index);
  if (reg.acc.empty()) {
    std::fill(out, out + reg.numel, 0.0f);
    return;
  }
  std::copy(reg.acc.begin(), reg.acc.begin() + reg.numel, out);
  std::vector<float>().swap(reg.acc);
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
  rejoin(now);
  flush();
  if (silent_too_long(now)) {
    log(40, "worker " + std::to_string(cfg_.worker_id) +
                " gives up waiting: " + describe_flights());
    gave_up_at_ = now;
    abort_call();
    return CallStatus::UNREACHABLE;
  }
  return CallStatus::PENDING;
}

// How long the switch has been silent while this worker waited on it: since the first packet
// sent after the last reply heard (not since that reply: a worker computing between calls sends
// nothing and waits on nothing).
// Written as next_wake() writes the deadline: the same floating-point sum.
bool Engine::silent_too_long(double now) const {
  return unanswered_since_ > last_rx_ && now >= unanswered_since_ + cfg_.dead_after;
}

double Engine::next_wake() const {
  double at = unanswered_since_ > last_rx_ ? unanswered_since_ + cfg_.dead_after
                                           : std::numeric_limits<double>::infinity();
  if (!timers_.empty()) at = std::min(at, timers_.top().at);
  if (call_) {
    at = std::min(at, std::max(progress_at_, joined_at_) + cfg_.join_after);
    for (double r : rejoin_at_) at = std::min(at, r);
  }
  return at;
}

std::vector<std::vector<uint8_t>> Engine::take_sent() {
  std::vector<std::vector<uint8_t>> out;
  out.swap(outbox_);
  return out;
}

void Engine::begin_call(int index, float* values, int64_t numel) {
  check_suspects();
  reset_why_.clear();
  call_ = std::make_unique<Call>(index, key(index), values, numel, w_);
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
  call_.reset();
  std::fill(rejoin_at_.begin(), rejoin_at_.end(), std::numeric_limits<double>::infinity());
}

void Engine::tick(double now) {
  expire(now);
  flush();
}

bool Engine::interrupted(double now) {
  if (!interrupted_ || now - checked_at_ < 0.1) return false;
  checked_at_ = now;
  return interrupted_();
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

// Gradient + residual of a local chunk of the call's key (zeros past the tensor's end).
void Engine::chunk_value(int64_t local, float* value) {
  const Call& c = *call_;
  const std::size_t n = c.lanes_of(local), off = std::size_t(local) * LANES;
  const float* res = &key(c.key).residual[off];
  for (std::size_t j = 0; j < LANES; ++j) value[j] = (j < n ? c.values[off + j] : 0.0f) + res[j];
}

// The chunk's gradient is no longer needed: its rows of `values` become its output, starting
// with what was buffered for it so far.
void Engine::open_output(int64_t local) {
  Call& c = *call_;
  Key& reg = key(c.key);
  const std::size_t n = c.lanes_of(local), off = std::size_t(local) * LANES;
  float* out = c.values + off;
  if (reg.acc.empty()) {
    std::fill(out, out + n, 0.0f);
  } else {
    std::copy(&reg.acc[off], &reg.acc[off] + n, out);
    std::fill(&reg.acc[off], &reg.acc[off] + LANES, 0.0f);
  }
  c.prepared[std::size_t(local)] = 1;
}

// Prepare a chunk of the call's key for its first transmission: quantize gradient + residual;
// the residual becomes the error (RULE B: right if the round includes me, see settle()).
void Engine::prepare_chunk(int64_t local, int32_t* fixed, float* err) {
  float value[LANES];
  chunk_value(local, value);
  quantizer_.quantize_lanes(value, fixed, err, LANES, stats_.quant);
  std::copy(err, err + LANES, &key(call_->key).residual[std::size_t(local) * LANES]);
  open_output(local);
}

// A chunk carried without ever being sent: its whole value stays as residual (RULE B).
void Engine::carry_unsent(int64_t local) {
  float value[LANES], fixed[LANES], err[LANES];
  chunk_value(local, value);
  quantizer_.quantize(value, fixed, err, LANES, stats_.quant);  // its stats, as if sent
  float* res = &key(call_->key).residual[std::size_t(local) * LANES];
  for (std::size_t j = 0; j < LANES; ++j) res[j] = value[j] * cfg_.staleness_decay;
  open_output(local);
}

// The fate of a chunk of this call is known. A prepared chunk's residual already holds its
// error (included); carried, it gets back the quantized amount too (staleness-weighted). An
// unprepared carried chunk is settled at the end of the call (it may still be sent, see
// follow_mode), or now by take_residual.
void Engine::settle(int64_t local, Outcome outcome, const Flight* f) {
  Call& c = *call_;
  c.outcome[std::size_t(local)] = outcome;
  if (outcome != Outcome::CARRIED || !c.prepared[std::size_t(local)] || f == nullptr) return;
  float* res = &key(c.key).residual[std::size_t(local) * LANES];
  const float s = quantizer_.scale_f32(), d = cfg_.staleness_decay;
  for (std::size_t j = 0; j < LANES; ++j) {
    const float q = float(f->lane(j)) / s;
    res[j] += d == 1.0f ? q : (q + f->err[j]) * d - f->err[j];
  }
}

// RULE B for the chunks whose fate was decided without a packet.
void Engine::finish() {
  Key& reg = key(call_->key);
  for (int64_t l = 0; l < reg.chunks; ++l) close_chunk(l);
  std::vector<float>().swap(reg.acc);  // every row went to the output
}

// Count a chunk's outcome and pay what RULE B still owes it: a carried chunk whose packet went
// back to its queue, or one never sent. SETTLED chunks were closed by take_residual.
void Engine::close_chunk(int64_t local) {
  Call& c = *call_;
  const std::size_t l = std::size_t(local);
  if (c.outcome[l] == Outcome::INCLUDED) ++stats_.included;
  if (c.outcome[l] == Outcome::CARRIED) {
    ++stats_.carried;
    settle_requeued(local);
  }
  if (!c.prepared[l]) carry_unsent(local);
}

// The call failed: forget what is in flight. Its outcome is unknown, so the chunks keep their
// full value as residual and the replica must resynchronize.
void Engine::abort_call() {
  Call& c = *call_;
  unanswered_since_ = -1;  // the next call gives the switch dead_after afresh
  drop_flights();
  for (auto& o : c.outcome)
    if (o == Outcome::PENDING) o = Outcome::CARRIED;
  finish();
  call_.reset();
  std::fill(rejoin_at_.begin(), rejoin_at_.end(), std::numeric_limits<double>::infinity());
  flag_resync("a call was aborted with contributions in flight");
}

// Forget every packet in flight as not counted: RULE B keeps its amount as residual.
void Engine::drop_flights() {
  for (uint32_t i = 0; i < w_; ++i) {
    Flight* f = flight_[i].get();
    if (!f) continue;
    if (f->kind == Kind::OWN && call_ && f->key == call_->key && !f->parked) {
      settle(f->local, Outcome::CARRIED, f);
    } else if (f->kind == Kind::RESIDUAL) {
      return_residual(*f, false);
    } else if (f->parked) {
      restore(*f);
    }
    flight_[i].reset();
  }
  inflight_ = 0;
  timers_ = decltype(timers_)();
}

std::string Engine::describe_flights() const {
  std::string out;
  int shown = 0, total = 0;
  for (uint32_t i = 0; i < w_; ++i) {
    const Flight* f = flight_[i].get();
    if (!f) continue;
    if (++total > 8) continue;
    ++shown;
    if (!out.empty()) out += "; ";
    out += "slot " + std::to_string(cfg_.slot_base + i) + ": " +
           (f->kind == Kind::OWN ? "own" : f->kind == Kind::RESIDUAL ? "residual" : "null") +
           " chunk " + std::to_string(f->chunk) + (f->async_style ? " seq " : " round ") +
           std::to_string(f->round) + " tries " + std::to_string(f->tries) +
           (f->stale ? " stale" : "") + (f->closed ? " closed" : "") +
           (f->parked ? " parked" : "") + (f->join ? " join" : "") + " (next_round " +
           std::to_string(next_round_[i]) + ", mode " + std::to_string(mode_[i]) + ")";
  }
  if (total > shown) out += "; ... " + std::to_string(total - shown) + " more";
  return out.empty() ? "nothing in flight" : out;
}

// ------------------------------------------------------------------ sending
void Engine::send_next(uint32_t i, double now) {
  if (!call_) return;
  auto& queue = call_->queues[i];
  while (!queue.empty()) {
    int64_t local = queue.front();
    queue.pop_front();
    if (call_->outcome[std::size_t(local)] == Outcome::PENDING) {
      send_own(i, local, nullptr, now);
      return;
    }
  }
}

void Engine::send_own(uint32_t i, int64_t local, const uint32_t* rnd, double now) {
  Call& c = *call_;
  const Key& reg = key(c.key);
  auto f = std::make_unique<Flight>();
  f->kind = Kind::OWN;
  f->key = c.key;
  f->local = local;
  f->chunk = uint32_t(reg.first + uint32_t(local));
  int32_t fixed[LANES];
  auto it = c.requeued.find(local);
  if (it != c.requeued.end()) {
    std::copy(it->second.first.begin(), it->second.first.end(), fixed);
    f->err = it->second.second;
    c.requeued.erase(it);
  } else {
    prepare_chunk(local, fixed, f->err.data());
  }
  for (std::size_t j = 0; j < LANES; ++j) store_be32(&f->data[H + 4 * j], uint32_t(fixed[j]));
  flight_[i] = std::move(f);
  ++inflight_;
  launch(i, rnd, now);
}

// A residual-only (or, with no key, zero) contribution for `chunk` at round `rnd`.
void Engine::send_extra(uint32_t i, Kind kind, int k, uint32_t chunk, uint32_t rnd, double now,
                        bool join) {
  auto f = std::make_unique<Flight>();
  f->kind = kind;
  f->key = k;
  f->chunk = chunk;
  f->join = join;
  if (k >= 0) {
    f->local = int64_t(chunk) - int64_t(key(k).first);
    take_residual(k, f->local, f->amount.data());
    f->has_amount = true;
    int32_t fixed[LANES];
    QuantStats unused;
    quantizer_.quantize_lanes(f->amount.data(), fixed, f->err.data(), LANES, unused);
    for (std::size_t j = 0; j < LANES; ++j) store_be32(&f->data[H + 4 * j], uint32_t(fixed[j]));
    ++stats_.residual_contribs;
  } else {
    ++stats_.null_contribs;
  }
  flight_[i] = std::move(f);
  ++inflight_;
  launch(i, &rnd, now);
}

// The call made no progress for join_after: offer every idle slot (nothing in flight, nothing
// left to send there in this call) a JOIN - a residual-only contribution for the key's last chunk
// on that slot, which the switch counts only into an open round that lacks me. Such a round is
// the other half of a cross-slot deadlock after an async -> sync swap (§9): its members wait
// for me on this slot, where an async round already counted my chunk, while I wait for them on
// another slot. A round with another chunk answers CHUNK_MISMATCH (retarget joins that chunk),
// a slot with no round open answers NOT_JOINED (the residual stays mine).
void Engine::join_idle_slots(double now) {
  if (!call_ || now < std::max(progress_at_, joined_at_) + cfg_.join_after) return;
  joined_at_ = now;
  for (uint32_t i = 0; i < w_; ++i)
    if (!flight_[i] && call_->queues[i].empty()) offer_join(i, now);
}

// A JOIN for idle slot i at its next_round: the residual of the key's last chunk on that slot
// (the key's chunks on slot i are start, start + W, ...), or zeros if the key has none there.
void Engine::offer_join(uint32_t i, double now) {
  const Key& reg = key(call_->key);
  const int64_t start = (int64_t(i) - int64_t(reg.first % w_) + w_) % w_;
  const int64_t last = start < reg.chunks ? start + (reg.chunks - 1 - start) / w_ * w_ : start;
  const uint32_t chunk = uint32_t(reg.first + uint32_t(last));
  const bool owned = last < reg.chunks;
  send_extra(i, owned ? Kind::RESIDUAL : Kind::NULLS, owned ? call_->key : -1, chunk,
             next_round_[i], now, true);
  ++stats_.joins;
}

// A JOIN of mine was counted on slot i: that slot's round waited for me while this call had
// nothing there. Its members' next contribution on the slot (sent when they get the round's
// result) waits for me just the same, so the slot is offered the next JOIN one RTO later -
// time for that contribution to open its round - instead of after another join_after. The
// chain ends where a JOIN is answered NOT_JOINED (no round waits for me) and with the call.
// Without it a member a call or more behind the others realigns one round per slot per
// join_after, far beyond the liveness bound (docs/protocol.md §9, "Swap storms").
void Engine::rejoin(double now) {
  if (!call_) return;
  for (uint32_t i = 0; i < w_; ++i) {
    if (rejoin_at_[i] > now) continue;
    rejoin_at_[i] = std::numeric_limits<double>::infinity();
    if (!flight_[i] && call_->queues[i].empty()) offer_join(i, now);
  }
}

// Move one chunk's residual into a residual-only packet (settling the current call's outcome
// for it first); return_residual adds back what stays due.
void Engine::take_residual(int k, int64_t local, float* amount) {
  Key& reg = key(k);
  float* res = &reg.residual[std::size_t(local) * LANES];
  if (call_ && call_->key == k) {
    Call& c = *call_;
    const std::size_t l = std::size_t(local);
    if (c.outcome[l] == Outcome::PENDING) {  // its residual rides on its own contribution
      std::fill(amount, amount + LANES, 0.0f);
      return;
    }
    close_chunk(local);
    c.outcome[l] = Outcome::SETTLED;
  }
  std::copy(res, res + LANES, amount);
  std::fill(res, res + LANES, 0.0f);
}

// RULE B for a residual-only packet: its quantization error, or all of it.
void Engine::return_residual(const Flight& f, bool included) {
  if (f.key < 0 || !f.has_amount) return;
  float* res = &key(f.key).residual[std::size_t(f.local) * LANES];
  const float* part = included ? f.err.data() : f.amount.data();
  for (std::size_t j = 0; j < LANES; ++j) res[j] += part[j];
}

// First transmission of the slot's flight at round *rnd (null: the slot's next round or seq).
void Engine::launch(uint32_t i, const uint32_t* rnd, double now) {
  Flight& f = *flight_[i];
  f.probe = !known_[i];
  if (rnd == nullptr && (f.probe || mode_[i] == ASYNC)) {
    f.round = next_seq(i);
    f.async_style = true;
  } else {
    f.round = rnd == nullptr ? next_round_[i] : *rnd;
    f.async_style = false;
  }
  uint8_t* d = f.data.data();
  d[wire::OFF_VERSION] = uint8_t(wire::VERSION);
  d[wire::OFF_OP] = uint8_t(wire::Op::CONTRIB);
  store_be16(d + wire::OFF_JOB_ID, uint16_t(cfg_.job_id));
  d[wire::OFF_WORKER_ID] = uint8_t(cfg_.worker_id);
  store_be16(d + wire::OFF_SLOT, uint16_t(cfg_.slot_base + i));
  store_be32(d + wire::OFF_ROUND, f.round);
  store_be32(d + wire::OFF_CHUNK, f.chunk);
  f.floor_known = known_[i];
  f.floor = next_round_[i];
  f.tries = 0;
  f.stale = false;
  f.closed = false;
  f.launched = now;
  f.backoff = rto_;
  transmit(i, now, false);
}

void Engine::transmit(uint32_t i, double now, bool retransmit, bool timeout) {
  Flight& f = *flight_[i];
  tx_number_[i] = (tx_number_[i] + 1) & TX_NUMBERS;
  f.tx = tx_number_[i];
  f.data[wire::OFF_FLAGS] = uint8_t((retransmit ? uint8_t(wire::Flag::RETRANSMIT) : 0) |
                                    (f.join ? uint8_t(wire::Flag::JOIN) : 0) |
                                    f.tx << wire::TX_SHIFT);
  if (retransmit) ++stats_.retransmits;
  if (retransmit && timeout) {
    f.backoff = std::min(2.0 * f.backoff, cfg_.rto_max);
    if (now - backed_off_ >= rto_) {
      // Back the timer off too (at most once per RTO, as TCP does): replies that only
      // retransmitted packets get carry no RTT sample (Karn), so without this a queue longer
      // than the RTO would keep every packet retransmitting.
      rto_ = std::min(2.0 * rto_, cfg_.rto_max);
      backed_off_ = now;
    }
  }
  ++f.tries;
  f.sent_at = now;
  if (unanswered_since_ <= last_rx_) unanswered_since_ = now;
  if (fd_ < 0) {
    outbox_.emplace_back(f.data.begin(), f.data.end());
    f.gen = ++gen_;
    timers_.push({now + f.backoff, f.gen, i});
    return;
  }
  uint8_t* out = tx_.append(cfg_.switch_addr, P);
  if (out == nullptr) {
    flush();
    out = tx_.append(cfg_.switch_addr, P);
  }
  std::memcpy(out, f.data.data(), P);
  f.gen = ++gen_;
  timers_.push({now + f.backoff, f.gen, i});
}

void Engine::flush() {
  if (fd_ >= 0 && tx_.size()) tx_.flush(fd_);
}

uint32_t Engine::next_seq(uint32_t i) {
  uint32_t seq = seq_[i] + 1;
  if (seq == 0) seq = 1;
  seq_[i] = seq;
  return seq;
}

// ------------------------------------------------------------------ timers
void Engine::expire(double now) {
  while (!timers_.empty() && timers_.top().at <= now) {
    const Timer t = timers_.top();
    timers_.pop();
    Flight* f = flight_[t.slot].get();
    if (!f || f->gen != t.gen) continue;
    const uint32_t i = t.slot;
    if (f->stale) {
      decide_stale(i, now);
      continue;
    }
    // A timer that fires late because this process waited for a core after its wait for the
    // timer ended (woke_late_; the socket was read first, read_before_timeouts): the switch
    // and the other workers share the machine and wait alike, so the reply may be as late.
    // It gets that long again, once, before the packet counts as lost.
    const double late = std::min(now - t.at, woke_late_);
    if (!t.extended && late >= cfg_.rto_min) {
      timers_.push({now + std::min(late, cfg_.rto_max), t.gen, t.slot, true});
      continue;
    }
    // The switch has said nothing, on any slot, since this packet left, so the whole window
    // waits on one slow process (a member that has not contributed yet, the switch waiting
    // for a core), which retransmitting every packet only adds to. One packet per RTO
    // probes; the others wait their next back-off (a lost window still goes out, later).
    // Not in partial mode, where silence is the switch's answer and retransmissions lead to
    // parking (stall_after), nor before a slot's mode is known.
    const bool silent = silent_flight(i);
    if (silent && now - probed_at_ < rto_) {
      f->backoff = std::min(2.0 * f->backoff, cfg_.rto_max);
      timers_.push({now + f->backoff, t.gen, t.slot, t.extended});
      continue;
    }
    if (silent) {
      probed_at_ = now;
      // The probe goes to the silent packet that has waited longest. Timers that wait their
      // turn back off to rto_max, the probes' own period: the same slot's timer would win
      // every probe and a lost packet on another slot would never go out again (seen: a
      // sync round waiting for ever on a member whose contribution was lost).
      const uint32_t j = longest_silent(i);
      if (j != i) {
        f->backoff = std::min(2.0 * f->backoff, cfg_.rto_max);
        timers_.push({now + f->backoff, t.gen, t.slot, t.extended});
        transmit(j, now, true);
        continue;
      }
    }
    // A call that found this slot held by a parked packet gave its answer one RTO (hurry);
    // unanswered, the call's chunks here are carried now.
    if (f->parked && mode_[i] == PARTIAL) carry_queue(i);
    if (!f->parked && !f->async_style && f->kind != Kind::NULLS && mode_[i] == PARTIAL &&
        !f->closed && next_round_[i] == f->round && f->tries >= 2 &&
        now - f->launched >= cfg_.stall_after)
      park(i);
    transmit(i, now, true);
  }
}

// Slot i's packet waits on a switch that has said nothing, on any slot, since it left (sync or
// async; not parked, not in a STALE reply's grace period).
bool Engine::silent_flight(uint32_t i) const {
  const Flight* f = flight_[i].get();
  return f && (mode_[i] == SYNC || mode_[i] == ASYNC) && !f->parked && !f->stale &&
         last_rx_ < f->sent_at;
}

// Of the silent packets, the one sent longest ago (slot i's if none is older).
uint32_t Engine::longest_silent(uint32_t i) const {
  uint32_t best = i;
  for (uint32_t j = 0; j < w_; ++j)
    if (j != i && silent_flight(j) && flight_[j]->sent_at < flight_[best]->sent_at) best = j;
  return best;
}

// Partial mode: the flight met only silence for stall_after while its round is, as far as this
// worker knows, the slot's open round. The switch is silent about a contribution it holds in an
// open round, so it is most likely counted in a round that waits for the others' next call. The
// call settles it as included and carries its remaining chunks on this slot, so that no call of
// mine waits for another worker's next call (across slots, that could wait forever). The packet
// stays in flight until the switch says for certain; if it was not counted, its amount goes
// back into the residual (done()).
void Engine::park(uint32_t i) {
  Flight& f = *flight_[i];
  f.parked = true;
  ++stats_.parked;
  if (f.kind == Kind::OWN && call_ && f.key == call_->key &&
      call_->outcome[std::size_t(f.local)] == Outcome::PENDING) {
    const float s = quantizer_.scale_f32();
    for (std::size_t j = 0; j < LANES; ++j) f.amount[j] = float(f.lane(j)) / s;
    f.has_amount = true;
    settle(f.local, Outcome::INCLUDED, &f);
    --call_->remaining;
  }
  carry_queue(i);
}

// A call starts while a parked packet holds slot i: retransmit it at once (its answer settles it
// and reports the slot's mode). The call's chunks on the slot wait for that answer for one RTO
// (the packet's timer), then are carried, in partial mode only (expire): in sync every round
// needs every member, so a slot left idle for a call deadlocks the job. Carrying at once would
// let a worker whose every slot is parked, behind a slow switch or slow members, run call after
// call with no round applied, its gradients piling up in its residual.
void Engine::hold_queue(uint32_t i, double now) {
  hurry(i, now);
}

// Retransmit a parked packet now; not a timeout: neither its backoff nor the RTO grows.
void Engine::hurry(uint32_t i, double now) {
  Flight& f = *flight_[i];
  if (!f.stale) {  // else its grace timer decides it within one RTO anyway
    f.backoff = rto_;
    transmit(i, now, true, false);
  }
}

// A reply reported slot i's mode. If it is no longer partial while this call's chunks there were
// carried because a parked packet held the slot, they are pending again.
void Engine::follow_mode(uint32_t i, double now) {
  if (!call_ || call_->held[i].empty() || mode_[i] == PARTIAL) return;
  Call& c = *call_;
  for (int64_t local : c.held[i]) {
    if (c.outcome[std::size_t(local)] == Outcome::CARRIED) {  // not SETTLED meanwhile
      c.outcome[std::size_t(local)] = Outcome::PENDING;
      ++c.remaining;
      c.queues[i].push_back(local);
    }
  }
  c.held[i].clear();
  Flight* f = flight_[i].get();
  if (!f)
    send_next(i, now);
  else if (f->parked)
    hurry(i, now);
}

// The slot is held by a parked packet: this call's chunks there are carried (unsent).
void Engine::carry_queue(uint32_t i) {
  if (!call_) return;
  Call& c = *call_;
  for (int64_t local : c.queues[i]) {
    if (c.outcome[std::size_t(local)] == Outcome::PENDING) {
      c.outcome[std::size_t(local)] = Outcome::CARRIED;
      c.held[i].push_back(local);
      --c.remaining;
    }
  }
  c.queues[i].clear();
}

// A carried chunk that was prepared, sent and then sent back to its queue: its packet's amount
// goes back into the residual (RULE B), as if its flight had been carried.
void Engine::settle_requeued(int64_t local) {
  auto it = call_->requeued.find(local);
  if (it == call_->requeued.end()) return;
  Flight tmp;
  for (std::size_t j = 0; j < LANES; ++j)
    store_be32(&tmp.data[H + 4 * j], uint32_t(it->second.first[j]));
  tmp.err = it->second.second;
  call_->requeued.erase(it);
  settle(local, Outcome::CARRIED, &tmp);
}

// A parked contribution was not counted after all: back into the residual.
void Engine::restore(const Flight& f) {
  if (f.key < 0 || !f.has_amount) return;
  float* res = &key(f.key).residual[std::size_t(f.local) * LANES];
  for (std::size_t j = 0; j < LANES; ++j) res[j] += f.amount[j];
  ++stats_.parked_missed;
}

void Engine::rtt_sample(const Flight& f, double now) {
  if (f.tries != 1) return;  // Karn: an answer to a retransmission says nothing about the RTT
  const double sample = now - f.sent_at;
  if (srtt_ < 0) {
    srtt_ = sample;
    rttvar_ = sample / 2;
  } else {
    rttvar_ = 0.75 * rttvar_ + 0.25 * std::fabs(sample - srtt_);
    srtt_ = 0.875 * srtt_ + 0.125 * sample;
  }
  // 4 x srtt, or srtt + 4 x rttvar (Jacobson) when the RTT jitters more than that: on a
  // loaded host spurious retransmissions otherwise feed back.
  const double rto = std::max(4.0 * srtt_, srtt_ + 4.0 * rttvar_);
  rto_ = std::clamp(rto, cfg_.rto_min, cfg_.rto_max);
}

// ------------------------------------------------------------------ outcomes
void Engine::end_flight(uint32_t i) {
  flight_[i].reset();
  --inflight_;
}

// The fate of slot i's flight is known (RULE B); the slot moves on to its next chunk.
void Engine::done(uint32_t i, bool included, double now, bool send_next_chunk) {
  Flight& f = *flight_[i];
  rtt_sample(f, now);
  progress_at_ = now;
  // A JOIN counted in a sync round chains the next one (rejoin); a partial round never waits
  // for one member beyond its quorum, and an async one for nobody.
  if (f.join && included && call_ && mode_[i] == SYNC && !cfg_.test_only_no_rejoin)
    rejoin_at_[i] = now + rto_;
  if (f.kind == Kind::OWN && f.parked) {
    if (!included) restore(f);
  } else if (f.kind == Kind::OWN) {
    if (call_ && call_->key == f.key &&
        call_->outcome[std::size_t(f.local)] == Outcome::PENDING) {
      settle(f.local, included ? Outcome::INCLUDED : Outcome::CARRIED, &f);
      --call_->remaining;
    }
  } else if (f.kind == Kind::RESIDUAL) {
    return_residual(f, included);
  }
  end_flight(i);
  if (send_next_chunk) send_next(i, now);
}

// ACK: counted, result lost; an async round's result is exactly my lanes / 1.
void Engine::apply_own(uint32_t i) {
  const Flight& f = *flight_[i];
  double lanes[LANES];
  for (std::size_t j = 0; j < LANES; ++j) lanes[j] = double(f.lane(j));
  add(f.chunk, lanes);
  auto& acked = acked_[i];
  if (acked.size() == ACK_MEMORY) acked.pop_front();
  std::array<uint8_t, 4 * LANES> raw;
  std::memcpy(raw.data(), &f.data[H], raw.size());
  acked.emplace_back(f.chunk, raw);
  ++stats_.own_applied;
}

float* Engine::acc_row(uint32_t chunk) {
  const int k = key_of(chunk);
  if (k < 0) return nullptr;
  Key& reg = key(k);
  if (!reg.alive) return nullptr;  // its name maps to a new range: nobody takes this one
  const int64_t local = int64_t(chunk) - int64_t(reg.first);
  if (call_ && call_->key == k && call_->prepared[std::size_t(local)]) {
    return call_->values + std::size_t(local) * LANES;  // straight into the call's output
  }
  if (reg.acc.empty()) reg.acc.assign(reg.residual.size(), 0.0f);
  return &reg.acc[std::size_t(local) * LANES];
}

void Engine::add(uint32_t chunk, const double* avg) {
  if (int64_t(chunk) >= next_chunk_) {  // no key owns it yet: kept until one does
    if (orphans_.size() >= MAX_ORPHANS && !orphans_.count(chunk)) {
      bad("result for chunk " + std::to_string(chunk) + ", which no key owns, beyond the " +
          std::to_string(MAX_ORPHANS) + " such chunks held");
      return;
    }
    auto& held = orphans_[chunk];
    for (std::size_t j = 0; j < LANES; ++j) held[j] += avg[j];
    return;
  }
  float* row = acc_row(chunk);
  if (!row) return;
  std::size_t n = LANES;
  if (call_ && row >= call_->values && row < call_->values + call_->numel)
    n = std::size_t(std::min<int64_t>(LANES, call_->values + call_->numel - row));
  for (std::size_t j = 0; j < n; ++j) row[j] += float(avg[j] / cfg_.scale);
}

void Engine::apply(const uint8_t* d) {
  stats_.results.insert(stats_.results.end(), d, d + H);
  const double count = double(d[wire::OFF_COUNT]);
  double avg[LANES];
  for (std::size_t j = 0; j < LANES; ++j)
    avg[j] = double(int32_t(load_be32(d + H + 4 * j))) / count;
  add(load_be32(d + wire::OFF_CHUNK), avg);
}

// ------------------------------------------------------------------ rounds (RULE A)
// The slot's rounds before `upto` are closed: suspect those not seen yet.
void Engine::advance(uint32_t i, uint32_t upto) {
  const uint32_t nr = next_round_[i];
  known_[i] = true;
  const uint32_t gap = upto - nr;
  if (gap == 0 || gap >= HALF32) return;
  if (gap > MAX_SUSPECT_GAP) {
    flag_resync("slot " + std::to_string(cfg_.slot_base + i) + " jumped " +
                std::to_string(gap) + " rounds ahead");
  } else {
    auto& suspect = suspect_[i];
    const double t = now();
    for (uint32_t r = 0; r < gap; ++r) suspect[nr + r] = t;
    if (std::find(suspect_slots_.begin(), suspect_slots_.end(), i) == suspect_slots_.end())
      suspect_slots_.push_back(i);
  }
  next_round_[i] = upto;
}

bool Engine::is_new(uint32_t i, uint32_t rnd) {
  if (ahead(rnd, next_round_[i])) {
    advance(i, rnd);
    next_round_[i] = rnd + 1;
    return true;
  }
  auto& suspect = suspect_[i];
  auto it = suspect.find(rnd);
  if (it != suspect.end()) {
    suspect.erase(it);
    return true;
  }
  return false;
}

// Count suspected rounds older than missed_after (minus one per own ACKed contribution, whose
// round is unknown); forget those older than SUSPECT_MEMORY.
void Engine::check_suspects() {
  const double t = now();
  const double judge = t - cfg_.missed_after, forget = t - SUSPECT_MEMORY;
  uint64_t missed = 0;
  std::vector<uint32_t> keep;
  for (uint32_t i : suspect_slots_) {
    auto& suspect = suspect_[i];
    auto& acked = acked_[i];
    std::size_t gone = 0;
    for (auto it = suspect.begin(); it != suspect.end();) {
      if (it->second < forget) {
        it = suspect.erase(it);
        ++gone;
      } else {
        ++it;
      }
    }
    if (gone > acked.size())
      flag_resync("results of slot " + std::to_string(cfg_.slot_base + i) + " never arrived");
    for (std::size_t n = std::min(gone, acked.size()); n > 0; --n) acked.pop_front();
    if (!suspect.empty()) keep.push_back(i);
    std::size_t old = 0;
    for (const auto& [r, since] : suspect) old += since < judge;
    missed += old > acked.size() ? old - acked.size() : 0;
  }
  suspect_slots_.swap(keep);
  const bool was = needs_resync();
  missed_results_ = missed;
  if (missed && !was)
    log_resync(std::to_string(missed) + " result(s) did not arrive within " +
               std::to_string(cfg_.missed_after) + " s");
}

void Engine::flag_resync(const std::string& why) {
  if (!needs_resync()) log_resync(why);
  if (resync_why_.empty()) resync_why_ = why;
  resync_flagged_ = true;
}

void Engine::log_resync(const std::string& why) {
  log(30, "worker " + std::to_string(cfg_.worker_id) +
              " fell out of the switch's retransmission window (" + why +
              "): its replica missed updates and must be resynchronized at the next "
              "averaging round");
}

// The replica was re-synchronized: forget missed and suspected rounds (results of those rounds
// that still arrive are dropped as duplicates).
void Engine::clear_resync() {
  resync_why_.clear();
  resync_flagged_ = false;
  missed_results_ = 0;
  for (uint32_t i : suspect_slots_) {
    suspect_[i].clear();
    acked_[i].clear();
  }
  suspect_slots_.clear();
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

// A full-size datagram: a RESULT, or garbage.
void Engine::on_full(const uint8_t* d, double now) {
  const Header h(d);
  const uint32_t i = uint32_t(h.slot) - cfg_.slot_base;
  if (h.version != wire::VERSION || h.op != uint8_t(wire::Op::RESULT) || h.job_id != cfg_.job_id ||
      h.slot < cfg_.slot_base || i >= w_ || h.count == 0) {
    std::string reason = decode_error(d, P);
    if (reason.empty())
      reason = "op " + std::to_string(h.op) + " job " + std::to_string(h.job_id) + " slot " +
               std::to_string(h.slot) + " count " + std::to_string(h.count) +
               ": not a RESULT of job " + std::to_string(cfg_.job_id) + " slots " +
               std::to_string(cfg_.slot_base) + ".." + std::to_string(cfg_.slot_base + w_ - 1);
    bad(reason);
    return;
  }
  last_rx_ = now;
  if (!current_state(h.reason, i, "RESULT", now)) return;
  mode_[i] = h.mode;
  const bool mine = h.bitmap & bit_;
  bool fresh = is_new(i, h.round);
  Flight* f = flight_[i].get();
  const bool counted = f && mine && f->chunk == h.chunk &&
      (h.mode != ASYNC ? h.round == f->round
                       : h.count == 1 && std::memcmp(d + H, &f->data[H], 4 * LANES) == 0);
  if (counted && h.mode == ASYNC && (f->floor_known ? !ahead(h.round, f->floor) : !fresh) &&
      acked_entry(i, d) == acked_[i].end() && !same_result(last_own_result_[i], d)) {
    // My async contribution, counted, closed a round that cannot be of the state that taught
    // me this slot's rounds: one below the round the slot had reached when I sent it (rounds
    // never step back), or - sent before I knew the slot - one whose number I applied already
    // (an async round holds one contribution, and a copy of a result of mine finds its flight
    // settled). The state that counted it is new, and results of its rounds that I took for
    // duplicates of the old state's were never applied (an async contribution is counted
    // whatever its sequence number, so nothing else tells): the replica must be resynchronized.
    // (Not a late copy of my last result, nor the result of an ACKed twin: same chunk, same
    // lanes.)
    const uint32_t floor = f->floor;
    const bool floor_known = f->floor_known;
    done(i, true, now);  // counted, by the new state
    switch_reset("the switch counted my async contribution on slot " +
                 std::to_string(cfg_.slot_base + i) + " in round " + std::to_string(h.round) +
                 (floor_known ? ", behind round " + std::to_string(floor) +
                                    " that it had reached before"
                              : ", a round I had applied already"));
    fresh = is_new(i, h.round);  // the first round of the new state heard on this slot
    keep_result(last_own_result_[i], d);
  } else if (counted) {
    if (h.mode == ASYNC) keep_result(last_own_result_[i], d);
    done(i, true, now);
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
      done(i, false, now);  // carried as residual (whatever chunk or mode it had)
    } else if (h.mode != ASYNC) {
      f->closed = true;
      f->closed_chunk = h.chunk;
    }
  }
  if (h.mode != PARTIAL) follow_mode(i, now);
  if (!fresh) {
    ++stats_.duplicate_results;
    return;
  }
  if (mine && h.mode == ASYNC && h.count == 1) {
    const auto it = acked_entry(i, d);
    if (it != acked_[i].end()) {
      acked_[i].erase(it);  // its ACK applied it already
      return;
    }
  }
  apply(d);
}

std::deque<std::pair<uint32_t, std::array<uint8_t, 4 * LANES>>>::iterator Engine::acked_entry(
    uint32_t i, const uint8_t* d) {
  const uint32_t chunk = load_be32(d + wire::OFF_CHUNK);
  auto& acked = acked_[i];
  return std::find_if(acked.begin(), acked.end(), [&](const auto& a) {
    return a.first == chunk && std::memcmp(a.second.data(), d + H, 4 * LANES) == 0;
  });
}

// A header-only datagram: RESYNC or ACK, or garbage.
void Engine::on_short(const uint8_t* d, std::size_t size, double now) {
  if (size != H) {
    bad(size > P ? "datagram longer than a " + std::to_string(P) + "-byte HySync packet"
                 : decode_error(d, size));
    return;
  }
  std::string err = decode_error(d, size);
  if (!err.empty()) {
    bad(err);
    return;
  }
  const Header h(d);
  const uint32_t i = uint32_t(h.slot) - cfg_.slot_base;
  const bool reply = h.op == uint8_t(wire::Op::RESYNC) || h.op == uint8_t(wire::Op::ACK);
  if (h.job_id != cfg_.job_id || h.slot < cfg_.slot_base || i >= w_ ||
      h.worker_id != cfg_.worker_id || !reply) {
    bad(std::string(op_name(h.op)) + " for job " + std::to_string(h.job_id) + " worker " +
        std::to_string(h.worker_id) + " slot " + std::to_string(h.slot) +
        " is not a reply to worker " + std::to_string(cfg_.worker_id) + " of job " +
        std::to_string(cfg_.job_id));
    return;
  }
  // The dead timer hears only replies that show the switch moving this worker's work along:
  // a STALE_ROUND or NOT_JOINED answers any packet, forever, from a switch that lost the job's
  // state or from a job that waits for a dead member, and must not keep a dead call alive;
  // nor may the CHUNK_MISMATCH a JOIN meets in such a job (a round of others, open forever).
  const Flight* f = i < w_ ? flight_[i].get() : nullptr;
  if (h.op == uint8_t(wire::Op::ACK) || h.reason == STALE_COUNTED ||
      (h.reason == CHUNK_MISMATCH && !(f && f->join)))
    last_rx_ = now;
  if (h.op == uint8_t(wire::Op::ACK) && !current_state(h.reason, i, "ACK", now)) return;
  mode_[i] = h.mode;
  if (h.op == uint8_t(wire::Op::ACK))
    on_ack(i, h.round, h.chunk, now);
  else
    on_resync(i, h.reason, h.round, h.chunk, h.mode, h.flags, now);
  if (h.mode != PARTIAL) follow_mode(i, now);
}

void Engine::on_ack(uint32_t i, uint32_t rnd, uint32_t chunk, double now) {
  ++stats_.acks;
  Flight* f = flight_[i].get();
  if (!f || rnd != f->round || chunk != f->chunk) {
    ++stats_.stray_replies;
    return;
  }
  counted_without_result(i, now);
}

void Engine::on_resync(uint32_t i, uint8_t reason, uint32_t rnd, uint32_t chunk, uint8_t mode,
                       uint8_t flags, double now) {
  if (reason > NOT_JOINED) {
    bad("RESYNC with unknown reason " + std::to_string(reason));
    return;
  }
  ++stats_.resyncs[reason];
  advance(i, rnd);
  Flight* f = flight_[i].get();
  if (!answers_latest(i, flags)) {
    // It answers an earlier transmission; a later one may still be counted (the slot may turn
    // async meanwhile, which counts any new sequence number), so only the answer to the latest
    // may settle the flight as not counted or send it again under another round.
    ++stats_.stray_replies;
    return;
  }
  if (reason == NOT_JOINED) {
    if (!f->join) {
      ++stats_.stray_replies;
      return;
    }
    done(i, false, now);  // no round to join: the residual stays mine
    return;
  }
  if (reason == CHUNK_MISMATCH) {
    // Only a contribution for the open round (rnd) with another chunk gets this.
    if (f->async_style || rnd != f->round || chunk == f->chunk) {
      ++stats_.stray_replies;
      return;
    }
    retarget(i, chunk, rnd, mode, now);
    return;
  }
  // STALE_*: the contribution's round was neither open nor just closed, so the open round is at
  // least two ahead of a sync-style round in flight.
  if (!f->async_style &&
      !(uint32_t(rnd - f->round) >= 2 && uint32_t(rnd - f->round) < HALF32)) {
    // The answer to my latest transmission says my round is not stale behind the open one:
    // the round I learned from this switch is ahead of it, or just closed with no result kept.
    // Rounds never step back and a result is kept until the next close, so the switch's state
    // for the job is new: it restarted, or the job was installed again (docs/protocol.md §9).
    switch_reset("the switch answered slot " + std::to_string(cfg_.slot_base + i) +
                 " with open round " + std::to_string(rnd) + " for a contribution at round " +
                 std::to_string(f->round));
    return;
  }
  if (f->probe) {  // first contact: no older packet of mine exists to confuse it with
    f->stale = true;
    f->stale_reason = reason;
    f->stale_mode = mode;
    decide_stale(i, now);
    return;
  }
  if (!f->stale) {
    f->gen = ++gen_;
    timers_.push({now + rto_, f->gen, i});
  }
  f->stale = true;  // the latest plausible reply wins
  f->stale_reason = reason;
  f->stale_mode = mode;
}

// The switch's state for the job is new. What the old state counted of the packets in flight
// is unknown (counted in a round that closed, whose result this worker missed; or wiped in an
// open round), so the call aborts: its chunks keep their full value as residual and the
// replica must be resynchronized, as after any abort. Every slot forgets its rounds, so the
// next call learns the new ones (a probe, as at the start) instead of sending rounds that the
// switch answers STALE forever.
void Engine::switch_reset(const std::string& what) {
  if (reset_why_.empty())
    reset_why_ = what + ": its state for job " + std::to_string(cfg_.job_id) +
                 " is new (the switch restarted, or the job was removed and added again)";
  if (tag_ >= 0) left_tag_ = tag_;  // the next tag heard is the new state's
  tag_ = -1;
  tag_changed_at_ = now();
  for (uint32_t j = 0; j < w_; ++j) {
    next_round_[j] = 0;
    known_[j] = false;
    last_own_result_[j].fill(0);
    suspect_[j].clear();
    acked_[j].clear();
  }
  suspect_slots_.clear();
  flag_resync(reset_why_);
  if (!call_) {  // between calls (residual-only or parked packets): nothing to abort
    log(30, "worker " + std::to_string(cfg_.worker_id) + ": " + reset_why_);
    drop_flights();
    reset_why_.clear();
  }
}

// A tag that is neither the one known nor, shortly after a change, the one left is a new state
// of the switch for this job: a restart, or the job installed again (docs/protocol.md §9). Later
// than two rto_max after a change the one left is taken for a new state too: packets are not
// delayed that long, and a tag is only 8 bits (the controller gives an install a tag unlike its
// predecessor's, not unlike every older one's).
bool Engine::current_state(uint8_t tag, uint32_t i, const char* what, double now) {
  if (tag == tag_) return true;
  if (tag == left_tag_ && now - tag_changed_at_ < 2 * cfg_.rto_max) {
    // a late packet of the state before: the replica misses it
    flag_resync("a " + std::string(what) + " of the switch's state before its last restart or "
                "re-install of the job arrived late");
    ++stats_.stray_replies;
    return false;
  }
  if (tag_ < 0) {  // the first tag heard, or the first since a reset
    tag_ = tag;
    return true;
  }
  const int was = tag_;
  switch_reset("the switch's " + std::string(what) + " on slot " +
               std::to_string(cfg_.slot_base + i) + " carries install tag " +
               std::to_string(tag) + ", not " + std::to_string(was));
  tag_ = tag;
  return true;
}

// Replies echo the transmission number of the contribution they answer (docs/protocol.md §4).
bool Engine::answers_latest(uint32_t i, uint8_t flags) const {
  const Flight* f = flight_[i].get();
  if (f != nullptr && cfg_.test_only_ignore_echo) return true;
  return f != nullptr && ((flags & wire::TX_MASK) >> wire::TX_SHIFT) == f->tx;
}

// A STALE reply stood for a grace period without the round's result arriving.
void Engine::decide_stale(uint32_t i, double now) {
  Flight& f = *flight_[i];
  f.stale = false;
  if (f.stale_reason == STALE_COUNTED)
    counted_without_result(i, now);
  else if (f.async_style || f.stale_mode == SYNC)
    launch(i, nullptr, now);  // not counted: again at the open round
  else
    done(i, false, now);  // partial: its round is gone, carried (not chased)
}

// ACK / STALE_COUNTED: the switch's member_seq holds the flight's round field, so it was
// counted, and its result did not reach me.
void Engine::counted_without_result(uint32_t i, double now) {
  Flight& f = *flight_[i];
  // Round 0 is no exception: a member_seq cell this install never wrote does not match (its
  // member_epoch differs, §4 step 8), so an ACK or STALE_COUNTED for a round-0 packet means the
  // switch counted it - after a swap to async, with the round field as its sequence number.
  // Taking that for "not counted" sent the same amount again with the chunk's next value.
  if (f.async_style || f.closed) {
    // Counted in an async round (a sync-style packet whose round closed without me can only
    // have been counted after the slot turned async): its result is exactly my lanes / 1.
    apply_own(i);
  } else {
    advance(i, f.round + 1);  // counted in sync round f.round; its result is late or lost
  }
  done(i, true, now);
}

// CHUNK_MISMATCH: the open round `rnd` aggregates `chunk`; contribute to it: my own `chunk` if
// it is pending in this call, else its residual (zeros if no key owns it and the round is
// sync). The flight's chunk waits for a later round in sync; in partial mode it is carried
// (RULE B) rather than chased into a round of its own, which would wait for the others' next
// call (and, across slots, could wait forever).
void Engine::retarget(uint32_t i, uint32_t chunk, uint32_t rnd, uint8_t mode, double now) {
  const int64_t local = call_ ? call_->pending(key(call_->key), chunk, i) : -1;
  int k = -1;
  if (local < 0) {
    k = key_of(chunk);
    if (k >= 0 && !key(k).alive) k = -1;
  }
  if (local < 0 && k < 0 && mode != SYNC) return;  // a partial round closes without me
  Flight& f = *flight_[i];
  const bool join = f.join;
  if (mode != SYNC || f.parked) {
    done(i, false, now, false);
  } else {
    if (f.kind == Kind::OWN && call_ && f.key == call_->key) {
      std::array<int32_t, LANES> lanes;
      for (std::size_t j = 0; j < LANES; ++j) lanes[j] = f.lane(j);
      call_->requeued[f.local] = {lanes, f.err};
      call_->queues[i].push_front(f.local);
    } else if (f.kind == Kind::RESIDUAL) {
      return_residual(f, false);
    }
    end_flight(i);
  }
  if (local >= 0) {
    auto& q = call_->queues[i];
    q.erase(std::find(q.begin(), q.end(), local));
    send_own(i, local, &rnd, now);
  } else if (k >= 0) {
    send_extra(i, Kind::RESIDUAL, k, chunk, rnd, now, join);
  } else {
    send_extra(i, Kind::NULLS, -1, chunk, rnd, now, join);
  }
}

}  // namespace hysync::worker
