// Results applied to the replica: a round's RESULT (its sum as a share of the output), and an
// own contribution the switch counted without its result reaching me (ACK), applied from its
// own lanes. Each slot remembers its latest own async results and ACKed contributions, so
// that a late copy is neither applied twice nor taken for a sign of new switch state. The
// datagrams ignored as bad are counted and logged here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "worker/call.h"
#include "worker/config.h"
#include "worker/keys.h"
#include "worker/log.h"
#include "worker/quantize.h"
#include "worker/slot.h"
#include "worker/stats.h"

namespace hysync::worker {

class Results {
 public:
  // `call`: the engine's call in progress (null between calls), whose prepared chunks take
  // results straight into the caller's buffer.
  Results(const EngineConfig& config, const Quantizer& quantizer, Keys& keys,
          std::vector<Slot>& slots, EngineStats& stats, Log& log,
          const std::unique_ptr<Call>& call)
      : cfg_(config), quantizer_(quantizer), keys_(keys), slots_(slots), stats_(stats),
        log_(log), call_(call) {}

  // A RESULT datagram (header and lanes), new to RULE A: applied to its chunk's output.
  void apply(const uint8_t* d);
  // Slot i's flight f was counted alone in an async round whose result did not reach me:
  // its lanes applied as that result would have been; remembered against a late copy.
  void apply_own(uint32_t i, const Flight& f);
  // The entry of slot i's ACKed contributions that an async RESULT d (count 1, my bit)
  // answers, or end().
  std::deque<Acked>::iterator acked_entry(uint32_t i, const uint8_t* d);
  // Slot i's sync-style flight f was settled as counted (ACK, STALE_COUNTED) and its result
  // is awaited: remembered as its twin, since counted in an async round, that result is a
  // round of one with f's lanes (Replies::on_full).
  void remember_twin(uint32_t i, const Flight& f);
  // The entry of slot i's ACKed twins that RESULT d (my bit) answers, or end(): an async
  // one (count 1) by its chunk and lanes, a sync or partial one by its round and chunk.
  std::deque<Twin>::iterator twin_entry(uint32_t i, const uint8_t* d);
  // Whether d is a copy of one of slot i's latest own async results; keep one.
  bool seen_own(uint32_t i, const uint8_t* d) const;
  void keep_own(uint32_t i, const uint8_t* d);

  // A datagram ignored: counted, and logged (the first few, then one in LOG_EVERY).
  void bad(const std::string& reason);
  uint64_t bad_datagrams() const { return bad_datagrams_; }

 private:
  void apply_result(uint32_t chunk, const double* avg, bool round_result);
  double divisor(uint8_t mode, uint8_t count) const;
  double lane_share(int32_t sum, double share) const;

  const EngineConfig& cfg_;
  const Quantizer& quantizer_;
  Keys& keys_;
  std::vector<Slot>& slots_;
  EngineStats& stats_;
  Log& log_;
  const std::unique_ptr<Call>& call_;
  uint64_t bad_datagrams_ = 0;
};

}  // namespace hysync::worker
