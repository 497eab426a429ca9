// Where a slot's round lives in the switch: each slot has two register banks, and a round
// uses the one of its parity, so the result of round r stays readable (for a late or lost
// reply's RESEND) while round r + 1 aggregates in the other (docs/protocol.md §4).
#pragma once
#include <cstdint>

namespace hysync {

inline uint32_t register_bank(uint32_t slot, uint32_t round) { return 2 * slot + (round & 1); }

}  // namespace hysync
