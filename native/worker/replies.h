// The switch's replies: each datagram the backend reads, decoded and accepted or ignored
// (bad), and what a RESULT, RESYNC or ACK means - RULE A for its round (rounds.h), the
// result applied (results.h), its flight's fate (flights.h) - and whether it shows the
// switch's state for the job to be new (a restart, a re-install), which ends the call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/call.h"
#include "worker/config.h"
#include "worker/faults.h"
#include "worker/flights.h"
#include "worker/log.h"
#include "worker/results.h"
#include "worker/rounds.h"
#include "worker/slot.h"
#include "worker/stats.h"

namespace hysync::worker {

// Why a datagram does not decode (hysync.wire.Packet.decode's messages), or "" if it does.
std::string decode_error(const uint8_t* d, std::size_t size);

class Replies final : public DatagramSink {
 public:
  Replies(const EngineConfig& config, const Faults& faults, const Backend& clock,
          std::vector<Slot>& slots, Rounds& rounds, Results& results, Flights& flights,
          EngineStats& stats, Log& log, const std::unique_ptr<Call>& call)
      : cfg_(config), faults_(faults), clock_(clock), slots_(slots), rounds_(rounds),
        results_(results), flights_(flights), stats_(stats), log_(log), call_(call),
        w_(uint32_t(slots.size())), bit_(1u << config.worker_id) {}

  void on_datagram(const uint8_t* data, std::size_t size, double now, double arrived) override;
  // Why a reply showed the switch's state to be new during the call ("" if none did): the
  // call aborts with RESET. Cleared when a call starts.
  const std::string& reset_why() const { return reset_why_; }
  void clear_reset() { reset_why_.clear(); }

 private:
  void on_full(const uint8_t* d, double now);
  void on_short(const uint8_t* d, std::size_t size, double now);
  void on_ack(uint32_t i, uint32_t rnd, uint32_t chunk, double now);
  void on_resync(uint32_t i, uint8_t reason, uint32_t rnd, uint32_t chunk, uint8_t mode,
                 uint32_t count, uint32_t bitmap, uint8_t flags, double now);
  void on_relayed(uint32_t i, const wire::Header& h, double now);
  bool answers_latest(uint32_t i, uint8_t flags) const;
  // RESULT and ACK carry the install tag of the switch's state for the job: false for a
  // packet of a state this worker has left (a new tag resets, see switch_reset).
  // `counts_flight`: the packet shows that slot i's flight was counted (settled so before a
  // new tag's reset forgets the flights).
  bool current_state(uint8_t tag, uint32_t i, const char* what, bool counts_flight, double now);
  // `tag_may_be_new`: Rounds::forget's.
  void switch_reset(const std::string& what, bool tag_may_be_new = false);

  const EngineConfig& cfg_;
  const Faults& faults_;
  const Backend& clock_;
  std::vector<Slot>& slots_;
  Rounds& rounds_;
  Results& results_;
  Flights& flights_;
  EngineStats& stats_;
  Log& log_;
  const std::unique_ptr<Call>& call_;
  const uint32_t w_, bit_;
  std::string reset_why_;
  double arrived_ = 0;  // when the datagram being handled arrived (DatagramSink)
};

}  // namespace hysync::worker
