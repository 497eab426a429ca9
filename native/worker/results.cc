// Results applied to the replica (results.h).
#include "worker/results.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>

#include "worker/wire_names.h"

namespace hysync::worker {

namespace {

constexpr uint64_t LOG_EVERY = 1000;  // after the first few, log one bad datagram in this many
constexpr std::size_t ACK_MEMORY = 64;      // own ACKed contributions remembered per slot
constexpr std::size_t OWN_RESULT_MEMORY = 8;  // own async results remembered per slot

// A RESULT's round, chunk (contiguous in the header) and lanes, as own_results keeps them.
bool same_result(const KeptResult& kept, const uint8_t* d) {
  return std::memcmp(kept.data(), d + wire::OFF_ROUND, 8) == 0 &&
         std::memcmp(kept.data() + 8, d + H, 4 * LANES) == 0;
}

void keep_result(KeptResult& kept, const uint8_t* d) {
  std::memcpy(kept.data(), d + wire::OFF_ROUND, 8);
  std::memcpy(kept.data() + 8, d + H, 4 * LANES);
}

// Whether d carries the entry's chunk and lanes.
bool same_lanes(const Acked& a, const uint8_t* d) {
  return a.first == load_be32(d + wire::OFF_CHUNK) &&
         std::memcmp(a.second.data(), d + H, 4 * LANES) == 0;
}

}  // namespace

// ACK: counted, result lost; an async round's result is exactly my lanes, applied as
// `apply` would have applied it.
void Results::apply_own(uint32_t i, const Flight& f) {
  const double share = divisor(uint8_t(wire::Mode::ASYNC), 1);
  double lanes[LANES];
  for (std::size_t j = 0; j < LANES; ++j) lanes[j] = lane_share(f.lane(j), share);
  apply_result(f.chunk, lanes, false);
  auto& acked = slots_[i].acked;
  if (acked.size() == ACK_MEMORY) acked.pop_front();
  std::array<uint8_t, 4 * LANES> raw;
  std::memcpy(raw.data(), &f.data[H], raw.size());
  acked.emplace_back(f.chunk, raw);
  ++stats_.own_applied;
  stats_.own.insert(stats_.own.end(), f.data.begin(), f.data.end());
}

void Results::apply_result(uint32_t chunk, const double* avg, bool round_result) {
  if (!keys_.apply(chunk, avg, call_.get(), round_result))
    bad("result for chunk " + std::to_string(chunk) + ", which no key owns, beyond the " +
        std::to_string(Keys::MAX_ORPHANS) + " such chunks held");
}

// A sync or partial round's result is the mean of its contributions (sum / count). An async
// round holds one member's contribution, applied as its share of the mean (sum / members):
// over the members' rounds a replica then moves as far as one sync round takes it, so a
// swap into or out of async does not change the step size n-fold (eager-SGD's solo
// all-reduce divides by the process count likewise).
double Results::divisor(uint8_t mode, uint8_t count) const {
  return mode == uint8_t(wire::Mode::ASYNC) ? double(cfg_.members) : double(count);
}

void Results::apply(const uint8_t* d) {
  stats_.results.insert(stats_.results.end(), d, d + H);
  if (d[wire::OFF_MODE] != SYNC || int(d[wire::OFF_COUNT]) != cfg_.members)
    ++stats_.uneven_results;
  const double share = divisor(d[wire::OFF_MODE], d[wire::OFF_COUNT]);
  double avg[LANES];
  for (std::size_t j = 0; j < LANES; ++j)
    avg[j] = lane_share(int32_t(load_be32(d + H + 4 * j)), share);
  apply_result(load_be32(d + wire::OFF_CHUNK), avg, true);
}

// A lane of a result (a sum of contributions) as its share of the output, in fixed point:
// NaN if a contribution in it was the overflow sentinel (a NaN, an infinity or a value
// beyond the quantizer's range), so every replica that applies the round sees it non-finite.
double Results::lane_share(int32_t sum, double share) const {
  return quantizer_.overflowed(sum) ? std::numeric_limits<double>::quiet_NaN()
                                    : double(sum) / share;
}

bool Results::seen_own(uint32_t i, const uint8_t* d) const {
  const auto& kept = slots_[i].own_results.kept;
  return std::any_of(kept.begin(), kept.end(), [&](const auto& k) { return same_result(k, d); });
}

// A ring, not a deque: one result of mine per async contribution passes here, and a deque of
// entries this size allocates a node for each.
void Results::keep_own(uint32_t i, const uint8_t* d) {
  OwnResults& own = slots_[i].own_results;
  if (own.kept.size() < OWN_RESULT_MEMORY) {
    own.kept.emplace_back();
    keep_result(own.kept.back(), d);
  } else {
    keep_result(own.kept[own.oldest], d);
    own.oldest = (own.oldest + 1) % OWN_RESULT_MEMORY;
  }
}

std::deque<Acked>::iterator Results::acked_entry(uint32_t i, const uint8_t* d) {
  auto& acked = slots_[i].acked;
  return std::find_if(acked.begin(), acked.end(),
                      [&](const auto& a) { return same_lanes(a, d); });
}

void Results::remember_twin(uint32_t i, const Flight& f) {
  auto& twins = slots_[i].twins;
  if (twins.size() == ACK_MEMORY) twins.pop_front();
  Twin twin{f.round, {f.chunk, {}}};
  std::memcpy(twin.acked.second.data(), &f.data[H], twin.acked.second.size());
  twins.push_back(twin);
}

std::deque<Twin>::iterator Results::twin_entry(uint32_t i, const uint8_t* d) {
  auto& twins = slots_[i].twins;
  const bool async = d[wire::OFF_MODE] == uint8_t(wire::Mode::ASYNC);
  const uint32_t rnd = load_be32(d + wire::OFF_ROUND), chunk = load_be32(d + wire::OFF_CHUNK);
  return std::find_if(twins.begin(), twins.end(), [&](const Twin& t) {
    return async ? d[wire::OFF_COUNT] == 1 && same_lanes(t.acked, d)
                 : t.round == rnd && t.acked.first == chunk;
  });
}

void Results::bad(const std::string& reason) {
  ++bad_datagrams_;
  ++stats_.bad_datagrams;
  if (bad_datagrams_ <= 10 || bad_datagrams_ % LOG_EVERY == 0)
    log_(Log::WARNING, "worker " + std::to_string(cfg_.worker_id) + " ignored a datagram (" +
                std::to_string(bad_datagrams_) + " so far): " + reason);
}

}  // namespace hysync::worker
