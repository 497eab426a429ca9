// Keys and their residuals (keys.h): chunk ranges, what was applied for each key, and RULE B.
#include "worker/keys.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "common/bytes.h"
#include "worker/call.h"
#include "worker/stats.h"

namespace hysync::worker {

namespace {

constexpr std::size_t H = wire::HEADER_BYTES;

}  // namespace

// ------------------------------------------------------------------ keys
int Keys::find(const std::string& name) const {
  auto it = names_.find(name);
  return it == names_.end() ? -1 : it->second;
}

int Keys::name_key(const std::string& name, int64_t numel, int64_t* was_numel) {
  *was_numel = -1;
  const int known = find(name);
  if (known >= 0) {
    if (at(known).numel == numel) return known;
    *was_numel = at(known).numel;
    at(known).alive = false;  // a result for its old range is nobody's now
  }
  const int index = add_key(name, numel);
  names_[name] = index;
  return index;
}

int Keys::add_key(const std::string& name, int64_t numel) {
  auto reg = std::make_unique<Key>();
  reg->name = name;
  reg->numel = numel;
  reg->chunks = std::max<int64_t>(1, (numel + int64_t(LANES) - 1) / int64_t(LANES));
  reg->first = uint32_t(next_chunk_);
  reg->residual.assign(std::size_t(reg->chunks) * LANES, 0.0f);
  reg->closed.assign(std::size_t(reg->chunks), 0);
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

int Keys::live_owner(uint32_t chunk) const {
  const int k = owner(chunk);
  return k >= 0 && at(k).alive ? k : -1;
}

int Keys::owner(uint32_t chunk) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), chunk);
  if (it == starts_.begin()) return -1;
  int pos = int(it - starts_.begin()) - 1;
  const Key& reg = *keys_[std::size_t(pos)];
  if (int64_t(chunk) >= int64_t(reg.first) + reg.chunks) return -1;
  return pos;
}

void Keys::take(int index, float* out) {
  Key& reg = at(index);
  if (reg.acc.empty()) {
    std::fill(out, out + reg.numel, 0.0f);
    return;
  }
  std::copy(reg.acc.begin(), reg.acc.begin() + reg.numel, out);
  std::vector<float>().swap(reg.acc);
}

// ------------------------------------------------------------------ residuals (RULE B)
// Gradient + residual of a local chunk of the call's key (zeros past the tensor's end).
void Keys::chunk_value(const Call& c, int64_t local, float* value) const {
  const std::size_t n = c.lanes_of(local), off = std::size_t(local) * LANES;
  const float* res = &at(c.key).residual[off];
  for (std::size_t j = 0; j < LANES; ++j) value[j] = (j < n ? c.values[off + j] : 0.0f) + res[j];
}

// The chunk's gradient is no longer needed: its rows of `values` become its output, starting
// with what was buffered for it so far.
void Keys::open_output(Call& c, int64_t local) {
  Key& reg = at(c.key);
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
// A sentinel in a lane whose output this call already holds non-finite (a round of this chunk
// applied since the key's last call, one that closed without me above all: in partial a late
// member's contribution meets the next round, and a round that closed without it was applied
// as its call began) is absorbed there: sent as 0, error 0. Every member applies that round,
// so the element reaches every member non-finite already; sent, it would make a second round
// non-finite - a second step skipped by every member's loss scaler, where gloo skips one.
void Keys::prepare_chunk(Call& c, int64_t local, int32_t* fixed, float* err) {
  float value[LANES];
  chunk_value(c, local, value);
  quantizer_.quantize_lanes(value, fixed, err, LANES, stats_.quant);
  Key& reg = at(c.key);
  if (!reg.acc.empty()) {
    const float* applied = &reg.acc[std::size_t(local) * LANES];
    for (std::size_t j = 0; j < LANES; ++j)
      if (fixed[j] == quantizer_.sentinel() && !std::isfinite(applied[j])) {
        fixed[j] = 0;
        stats_.absorbed.push_back(uint64_t(reg.chunk_id(local)) * LANES + j);
      }
  }
  std::copy(err, err + LANES, &reg.residual[std::size_t(local) * LANES]);
  open_output(c, local);
}

// A chunk carried without ever being sent: its whole value stays as residual (RULE B).
void Keys::carry_unsent(Call& c, int64_t local) {
  float value[LANES], fixed[LANES], err[LANES];
  chunk_value(c, local, value);
  quantizer_.quantize(value, fixed, err, LANES, stats_.quant);  // its stats, as if sent
  float* res = &at(c.key).residual[std::size_t(local) * LANES];
  for (std::size_t j = 0; j < LANES; ++j) res[j] = value[j] * cfg_.staleness_decay;
  open_output(c, local);
}

// The fate of a chunk of this call is known. A prepared chunk's residual already holds its
// error (included); carried, it gets back the quantized amount too (staleness-weighted). An
// unprepared carried chunk is settled at the end of the call (it may still be sent, see
// follow_mode), or now by take_residual.
// A sentinel lane (the element was not finite, or beyond the range) comes back as NaN: the
// next contribution sends the sentinel again, and once a round counts it its error, 0, is
// the residual: carried until counted, never for ever. Unless `round`, the result of the
// round that closed without this flight, is non-finite in that lane already: that sum is
// what it would have been with mine (NaN absorbs), every member applies it, so mine is
// delivered there and is not carried into a later round (which would make a second step
// non-finite for every member, where gloo has one).
void Keys::settle(Call& c, int64_t local, Outcome outcome, const Flight* f,
                  const uint8_t* round) {
  c.outcome[std::size_t(local)] = outcome;
  if (outcome != Outcome::CARRIED || !c.prepared[std::size_t(local)] || f == nullptr) return;
  float* res = &at(c.key).residual[std::size_t(local) * LANES];
  const float d = cfg_.staleness_decay;
  for (std::size_t j = 0; j < LANES; ++j) {
    if (absorbed(*f, round, j)) {  // its error, 0, stays
      stats_.absorbed.push_back(uint64_t(f->chunk) * LANES + j);
      continue;
    }
    const float q = quantizer_.own_value(f->lane(j));
    res[j] += d == 1.0f ? q : (q + f->err[j]) * d - f->err[j];
  }
}

// Lane j of flight f is a sentinel that `round` (the result of the round f missed, or null)
// holds non-finite already: delivered there, not carried (settle()).
bool Keys::absorbed(const Flight& f, const uint8_t* round, std::size_t j) const {
  return round != nullptr && f.lane(j) == quantizer_.sentinel() &&
         quantizer_.overflowed(int32_t(load_be32(round + H + 4 * j)));
}

// RULE B for the chunks whose fate was decided without a packet.
void Keys::finish(Call& c) {
  Key& reg = at(c.key);
  for (int64_t l = 0; l < reg.chunks; ++l) close_chunk(c, l);
  std::vector<float>().swap(reg.acc);  // every row went to the output
}

// Count a chunk's outcome and pay what RULE B still owes it: a chunk never sent. SETTLED
// chunks were closed by take_residual.
void Keys::close_chunk(Call& c, int64_t local) {
  const std::size_t l = std::size_t(local);
  if (c.outcome[l] == Outcome::INCLUDED) ++stats_.included;
  if (c.outcome[l] == Outcome::CARRIED) ++stats_.carried;
  if (!c.prepared[l]) carry_unsent(c, local);
}

// Move one chunk's residual into a residual-only packet (settling the current call's outcome
// for it first); return_residual adds back what stays due.
void Keys::take_residual(int k, int64_t local, float* amount, Call* call) {
  Key& reg = at(k);
  float* res = &reg.residual[std::size_t(local) * LANES];
  if (call && call->key == k) {
    Call& c = *call;
    const std::size_t l = std::size_t(local);
    if (c.outcome[l] == Outcome::PENDING) {  // its residual rides on its own contribution
      std::fill(amount, amount + LANES, 0.0f);
      return;
    }
    close_chunk(c, local);
    c.outcome[l] = Outcome::SETTLED;
  }
  std::copy(res, res + LANES, amount);
  std::fill(res, res + LANES, 0.0f);
}

// RULE B for a residual-only packet: its quantization error, or all of it (a sentinel's
// amount is NaN, unless the round it missed absorbed it: settle()).
void Keys::return_residual(const Flight& f, bool included, const uint8_t* round) {
  if (f.key < 0 || !f.has_amount) return;
  float* res = &at(f.key).residual[std::size_t(f.local) * LANES];
  const float* part = included ? f.err.data() : f.amount.data();
  for (std::size_t j = 0; j < LANES; ++j) {
    if (!included && absorbed(f, round, j))
      stats_.absorbed.push_back(uint64_t(f.chunk) * LANES + j);
    else
      res[j] += part[j];
  }
}

// A parked contribution was not counted after all: back into the residual (as above).
void Keys::restore(const Flight& f, const uint8_t* round) {
  if (f.key < 0 || !f.has_amount) return;
  float* res = &at(f.key).residual[std::size_t(f.local) * LANES];
  for (std::size_t j = 0; j < LANES; ++j) {
    if (absorbed(f, round, j))
      stats_.absorbed.push_back(uint64_t(f.chunk) * LANES + j);
    else
      res[j] += f.amount[j];
  }
  ++stats_.parked_missed;
}

// ------------------------------------------------------------------ results
float* Keys::output_row(uint32_t chunk, Call* call, bool round_result) {
  const int k = owner(chunk);
  if (k < 0) return nullptr;
  Key& reg = at(k);
  if (!reg.alive) return nullptr;  // its name maps to a new range: nobody takes this one
  const int64_t local = reg.local_of(chunk);
  if (round_result) reg.closed[std::size_t(local)] = ++round_results_;
  if (call && call->key == k && call->prepared[std::size_t(local)]) {
    return call->values + std::size_t(local) * LANES;  // straight into the call's output
  }
  if (reg.acc.empty()) reg.acc.assign(reg.residual.size(), 0.0f);
  return &reg.acc[std::size_t(local) * LANES];
}

bool Keys::apply(uint32_t chunk, const double* avg, Call* call, bool round_result) {
  if (int64_t(chunk) >= next_chunk_) {  // no key owns it yet: kept until one does
    if (orphans_.size() >= MAX_ORPHANS && !orphans_.count(chunk)) {
      return false;
    }
    auto& held = orphans_[chunk];
    for (std::size_t j = 0; j < LANES; ++j) held[j] += avg[j];
    return true;
  }
  float* row = output_row(chunk, call, round_result);
  if (!row) return true;
  std::size_t n = LANES;
  if (call && row >= call->values && row < call->values + call->numel)
    n = std::size_t(std::min<int64_t>(LANES, call->values + call->numel - row));
  for (std::size_t j = 0; j < n; ++j) row[j] += float(avg[j] / cfg_.scale);
  return true;
}

}  // namespace hysync::worker
