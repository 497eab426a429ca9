// What one call (or one poll between calls) did: CallStats' counters (worker/transport.py).
#pragma once
#include <cstdint>
#include <vector>

#include "worker/quantize.h"

namespace hysync::worker {

struct EngineStats {
  uint64_t included = 0, carried = 0, residual_contribs = 0, null_contribs = 0, own_applied = 0,
           retransmits = 0, parked = 0, parked_missed = 0, acks = 0, duplicate_results = 0,
           stray_replies = 0, bad_datagrams = 0, joins = 0;
  uint64_t uneven_results = 0;  // results applied that are not a sync round of every member
  uint64_t resent = 0;  // parked packets sent again without a timeout (hurry, parking)
  uint64_t state_resets = 0;  // replies that showed the switch's state for the job to be new
  uint64_t relayed = 0;  // RESYNCs a leaf relayed from the spine (docs/protocol.md §11)
  uint64_t resyncs[5] = {0, 0, 0, 0, 0};  // by ResyncReason
  double waited_s = 0;  // blocked until the switch replied (or a timer fell due)
  QuantStats quant;
  std::vector<uint8_t> results;  // the header of every result applied, HEADER_BYTES each
  // The datagram (PACKET_BYTES) of every flight of mine applied as its own async round's result
  // (an ACK, a STALE_COUNTED: counted, its RESULT lost): the simulation's books.
  std::vector<uint8_t> own;
  // The datagram (PACKET_BYTES) of every flight of mine whose ACK or STALE_COUNTED was taken
  // for "not counted" because it was sent at the round of a packet of another chunk that my
  // last abort forgot on the slot (counted_without_result): the simulation's books, where the
  // answer was the flight's own count after all (counted twice, under the abort's resync flag).
  std::vector<uint8_t> forgotten_round_refused;
  // Sentinels of mine absorbed by a non-finite round (settle(), prepare_chunk()): chunk * 64 +
  // lane each (the simulation's books; CallStats counts them).
  std::vector<uint64_t> absorbed;
};

}  // namespace hysync::worker
