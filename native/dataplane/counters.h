// The packet-and-byte counters of docs/protocol.md §8, sharded per data-plane thread.
//
// Every thread that runs packets owns one CounterShard and is its only writer, so counting is
// a plain add with no shared cache line between threads. A read sums the shards; a control-
// plane write (or clear) moves a per-cell base instead of touching the shards: value = sum -
// base, in wrapping 64-bit arithmetic, so a write never races a packet.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hysync_wire.h"

namespace hysync::dataplane {

// Order of COUNTER_NAMES in softswitch/pipeline.py.
enum CounterId : int {
  CONTRIBUTIONS, LATE, DUPLICATES, STALE, CLOSES, DROPS, SWITCH_DROPS, RESULTS, NUM_COUNTERS
};

inline constexpr uint32_t MEMBER_CELLS = wire::MAX_JOBS * wire::MAX_WORKERS;
inline constexpr uint32_t DROP_CELLS = wire::MAX_JOBS * wire::NUM_DROP_REASONS;

inline constexpr uint32_t counter_size(int id) {
  return id == DROPS ? DROP_CELLS : id == SWITCH_DROPS ? wire::NUM_DROP_REASONS : MEMBER_CELLS;
}

class CounterShard {
 public:
  CounterShard();
  // One packet of `nbytes` in cell `index`; an index past the counter is ignored (the
  // controller never installs a job or worker id that would produce one).
  void count(int id, uint32_t index, uint64_t nbytes) {
    if (index >= counter_size(id)) return;
    Cell& c = cells_[id][index];
    // Single writer: relaxed load + store is a plain add, still a well-defined concurrent read.
    c.packets.store(c.packets.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    c.bytes.store(c.bytes.load(std::memory_order_relaxed) + nbytes, std::memory_order_relaxed);
  }
  uint64_t packets(int id, uint32_t i) const { return cells_[id][i].packets.load(std::memory_order_relaxed); }
  uint64_t bytes(int id, uint32_t i) const { return cells_[id][i].bytes.load(std::memory_order_relaxed); }

 private:
  struct Cell {
    std::atomic<uint64_t> packets{0}, bytes{0};
  };
  std::vector<Cell> cells_[NUM_COUNTERS];
};

// Every shard of one pipeline, and the bases that control-plane writes set.
class Counters {
 public:
  Counters();
  // A new shard for a data-plane thread; it lives as long as the Counters.
  CounterShard& add_shard();
  // Cells [start, stop) of counter `id`: packets and bytes.
  void read(int id, uint32_t start, uint32_t stop, std::vector<uint64_t>& packets,
            std::vector<uint64_t>& bytes) const;
  // Set cells [start, stop) to the given values (packets and/or bytes).
  void write(int id, uint32_t start, uint32_t stop, const uint64_t* packets, const uint64_t* bytes);
  void clear(int id);

 private:
  uint64_t sum_packets(int id, uint32_t i) const;
  uint64_t sum_bytes(int id, uint32_t i) const;
  mutable std::mutex mu_;  // guards shards_ (the vector) and the bases
  std::vector<std::unique_ptr<CounterShard>> shards_;
  std::vector<uint64_t> base_packets_[NUM_COUNTERS], base_bytes_[NUM_COUNTERS];
};

}  // namespace hysync::dataplane
