// A switch's level in a job that spans switches (docs/protocol.md §11), as softswitch/levels.py
// has it: what the controller sets per job beside its jobs entry, and the registers a leaf or
// a spine keeps per slot beside §3's. The rules themselves are Pipeline members (levels.cc).
#pragma once
#include <cstdint>

namespace hysync::dataplane {

enum class Level : uint8_t { SINGLE = 0, LEAF = 1, SPINE = 2 };

// A job's role on this switch. A leaf's uplink: the spine's address and MAC, the leaf's member
// id at the spine and the leaf's own address (the uplink's source, which the spine admits).
struct JobRole {
  Level level = Level::SINGLE;
  uint32_t spine_addr = 0;
  uint64_t spine_mac = 0;
  uint8_t uplink_id = 0;
  uint32_t leaf_addr = 0;
};

// Per slot, at a spine: the hosts in the open round (its count counts leaves). At a leaf: its
// sum of round up_round is at the spine with no verdict yet (up_pending), the hosts in it, its
// count and chunk, and the transmission number of its latest uplink.
struct LevelSlot {
  uint32_t weight = 0;
  bool up_pending = false;
  uint32_t up_round = 0, up_bitmap = 0, up_count = 0, up_chunk = 0, up_tx = 0;
};

// a is later than b, as 32-bit serial numbers (rounds wrap).
inline bool serial_after(uint32_t a, uint32_t b) {
  const uint32_t d = a - b;
  return d != 0 && d < (1u << 31);
}

}  // namespace hysync::dataplane
