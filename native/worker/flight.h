// A flight: the one packet in flight on a slot, its bytes and what the engine knows of it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "hysync_wire.h"

namespace hysync::worker {

constexpr std::size_t LANES = wire::LANES;
constexpr std::size_t P = wire::PACKET_BYTES;

enum class Outcome : int8_t { PENDING, INCLUDED, CARRIED, SETTLED };
enum class Kind : uint8_t { OWN, RESIDUAL, NULLS };  // my chunk, a residual, zeros

// What a flight knows besides its bytes. Flights::new_flight() reuses ended flights and resets
// only this part: launch writes the header, the sender the lanes and what err and amount hold
// for its kind (a NULLS flight's zero lanes included).
struct FlightState {
  Kind kind = Kind::OWN;
  int key = -1;  // the key's index (Keys), -1 for NULLS
  int64_t local = -1;
  uint32_t chunk = 0;
  bool has_amount = false;
  uint32_t round = 0;
  // The slot's next round when it was launched, if known: the switch, in the state that
  // taught it, counts the flight in that round or a later one (rounds never step back).
  bool floor_known = false;
  uint32_t floor = 0;
  bool async_style = false, probe = false, parked = false;
  bool join = false;  // flag JOIN: counted only into an open round that lacks me
  // A JOIN offered at once at the slot's next round on a RESEND (Replies::on_full), not by
  // join_after: refused there, it says nothing of the call's progress (Flights::done).
  bool join_at_once = false;
  bool chase = false;  // RESIDUAL: a chunk a sync round of another chunk displaced (send_chased)
  bool reoffer = false;  // RESIDUAL: a partial call's displaced chunk offered again (round_closed)
  // The call that sent it (Flights::calls_; 0: none): a chased chunk that an earlier call
  // sent does not move the call under way along when it settles (Flights::done, join_after).
  uint64_t call = 0;
  uint8_t tx = 0;     // the number of its latest transmission, which replies echo
  double launched = 0, sent_at = 0, backoff = 0;
  uint64_t sent_seq = 0;  // the worker's transmissions counted at its latest one
  int tries = 0;
  uint64_t gen = 0;
  bool stale = false;  // a STALE reply under its grace period
  uint8_t stale_reason = 0, stale_mode = 0;
  // Rounds::resets() when that reply came: a grace period that ends after a reset decides on
  // a reply of the state left, whose rounds are not the new state's.
  uint64_t stale_resets = 0;
  bool early_look = false;  // partial: its first timer is stall_after's look (expire)
  // Partial: settled by a RESULT that another member's contribution closed, so it waited in
  // an open round for the others: its delay is no round trip (Flights::rtt_sample).
  bool held_for_others = false;
  bool closed = false;  // its round was seen closed without me
  uint32_t closed_chunk = 0;
  // ...with my bit on another chunk: another contribution of mine (one an aborted call
  // forgot) holds my place there, and the switch's record of my round is that one's.
  bool closed_by_my_other = false;
  // The switch refused this flight's sequence number (a STALE_ROUND, a probe's above all)
  // while a contribution of mine sat in the open round: that refusal mark replaced the open
  // round's record in member_seq (docs/protocol.md §4 step 8), so the record of my round is no
  // other contribution's, and an ACK or STALE_COUNTED of it answers this flight's own count.
  // Kept across its relaunch.
  bool refused_over_my_other = false;
  // Sent at the round where the last abort forgot a packet of mine of another chunk on this
  // slot (Slot::forgot): an ACK or STALE_COUNTED for that round may answer the forgotten
  // packet's count, not this flight's, also when the round's RESULT, which would show my bit
  // on the other chunk (closed_by_my_other), is lost.
  bool at_forgotten_round = false;
};

// The one packet in flight on a slot; it owns its bytes.
struct Flight : FlightState {
  std::array<uint8_t, P> data{};  // the datagram, header and big-endian lanes
  std::array<float, LANES> err{};   // quantization error of what it carries
  std::array<float, LANES> amount{};  // RESIDUAL: the residual it took; parked OWN: what it adds
  int32_t lane(std::size_t j) const;
};

}  // namespace hysync::worker
