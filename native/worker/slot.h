// What the worker knows of one slot of its window: the slot's rounds (RULE A), its mode as the
// switch last reported it, its transmission numbers and its flight.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "worker/flight.h"

namespace hysync::worker {

using KeptResult = std::array<uint8_t, 8 + 4 * LANES>;  // a RESULT's round, chunk and lanes
// An own contribution counted without its result (ACK): its chunk and lanes.
using Acked = std::pair<uint32_t, std::array<uint8_t, 4 * LANES>>;
// A sync-style contribution of mine settled as counted by an ACK or STALE_COUNTED, its result
// awaited: its round field, chunk and lanes.
struct Twin {
  uint32_t round;
  Acked acked;
};

// Round, chunk and lanes of the last async results of mine that settled a flight (none since
// the slot's rounds were learned), so that a late copy of one is not taken for a sign of new
// switch state. Several, not the last one only: calls of zero gradients send a chunk's flights
// with the same lanes, and a copy the network delayed can arrive after two newer results. A
// copy, not a digest: the receive loop only copies.
struct OwnResults {
  std::vector<KeptResult> kept;  // at most OWN_RESULT_MEMORY (results.cc), filled lazily
  std::size_t oldest = 0;        // once full: the entry the next one replaces
};

struct Slot {
  uint32_t next_round = 0;  // the slot's open round as far as I know (RULE A)
  uint32_t seq = 0;         // the last async-style sequence number sent (next_seq)
  bool known = false;       // next_round was learned from the switch
  // next_round was last taught while no install tag was known (a RESYNC after a reset or at
  // attach): the state that taught it may be older than the tag known now (Rounds::forget)
  bool taught_untagged = false;
  int mode = -1;            // the mode the switch last reported (-1: not yet)
  uint8_t tx_number = 0;    // the number of the latest transmission (mod 32)
  // Chunks (global ids) a sync round of another chunk displaced, to send again as residual
  // when the slot has nothing else to send in a call (send_chased).
  std::deque<uint32_t> chased;
  OwnResults own_results;
  std::map<uint32_t, double> suspect;  // rounds skipped, not seen yet: round -> since
  std::deque<Acked> acked;             // at most ACK_MEMORY (results.cc)
  // Sync-style contributions of mine settled as counted by an ACK or STALE_COUNTED, whose
  // result is awaited (their rounds suspected, RULE A), at most ACK_MEMORY. Counted in an
  // async round after a swap, such a contribution's result is a round of one with its lanes,
  // which a later packet of the same chunk and lanes would take for its own; counted in its
  // sync round, that round's result, with my bit, ends the wait.
  std::deque<Twin> twins;
  // The sync-style packet of mine that the last abort forgot here (drop_all), if any: its
  // round field and chunk. The switch may have counted it in that round after the abort, and
  // member_seq then holds that round for me.
  bool forgot = false;
  uint32_t forgot_round = 0, forgot_chunk = 0;
  // When the latest packet of mine here (a JOIN's aside), if sync-style and sent more than
  // once (a call's hurry, a timer's retransmission), was last sent (-1: none such), and the
  // timer of a contribution held until that copy is one RTO old (Flights::
  // hold_past_sync_copy): in async a copy still on its way is refused only while my member
  // cell holds its round field.
  double sync_sent_at = -1;
  uint64_t held_gen = 0;
  std::unique_ptr<Flight> flight;      // null: idle
};

}  // namespace hysync::worker
