// The control-plane state the data plane reads: an immutable snapshot of the P4Runtime tables
// and multicast groups (docs/protocol.md §8). The Python server keeps the authoritative entries
// (softswitch/tables.py) and, after each write batch, builds a whole new snapshot that the
// pipeline swaps in at once: one P4Runtime batch is atomic with respect to packets.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dataplane/levels.h"

namespace hysync::dataplane {

struct MemberKey {
  uint16_t job;
  uint8_t worker;
  uint32_t ip;
  uint16_t port;
  bool operator==(const MemberKey& o) const {
    return job == o.job && worker == o.worker && ip == o.ip && port == o.port;
  }
};

struct MemberKeyHash {
  std::size_t operator()(const MemberKey& k) const {
    uint64_t x = uint64_t(k.ip) << 32 | uint64_t(k.port) << 16 | k.job;
    x ^= uint64_t(k.worker) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    return std::size_t(x ^ (x >> 29));
  }
};

struct JobConfig {
  uint32_t slot_base, slot_count, members, group;
  uint32_t epoch;  // the install epoch: a slot another install used last starts afresh
};

// One row of a job's modes table, in the reference model's order: highest priority first,
// ties broken by (lo, hi, mode, quorum).
struct ModeRange {
  int64_t neg_priority;
  uint32_t lo, hi, mode, quorum;
  bool operator<(const ModeRange& o) const;
};

struct Rewrite {
  uint64_t mac;
  uint32_t ip;
  uint16_t port;
};

// A multicast replica with its egress rewrite resolved (has_rewrite false: egress drops it).
struct Replica {
  uint16_t port;
  uint32_t rid;
  bool has_rewrite;
  Rewrite rewrite;
};

struct Tables {
  std::unordered_set<MemberKey, MemberKeyHash> members;
  std::unordered_map<uint32_t, JobConfig> jobs;
  std::unordered_map<uint32_t, std::vector<ModeRange>> modes;  // per job, sorted
  std::unordered_map<uint64_t, uint16_t> l2;                   // dst MAC -> egress port
  std::unordered_map<uint32_t, std::vector<Replica>> groups;   // in replica order
  std::unordered_map<uint32_t, JobRole> roles;  // a job that spans switches; absent: single
};

}  // namespace hysync::dataplane
