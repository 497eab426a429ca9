#include "dataplane/counters.h"

namespace hysync::dataplane {

CounterShard::CounterShard() {
  for (int id = 0; id < NUM_COUNTERS; ++id) cells_[id] = std::vector<Cell>(counter_size(id));
}

Counters::Counters() {
  for (int id = 0; id < NUM_COUNTERS; ++id) {
    base_packets_[id].assign(counter_size(id), 0);
    base_bytes_[id].assign(counter_size(id), 0);
  }
}

CounterShard& Counters::add_shard() {
  std::lock_guard<std::mutex> lock(mu_);
  shards_.push_back(std::make_unique<CounterShard>());
  return *shards_.back();
}

uint64_t Counters::sum_packets(int id, uint32_t i) const {
  uint64_t total = 0;
  for (const auto& shard : shards_) total += shard->packets(id, i);
  return total;
}

uint64_t Counters::sum_bytes(int id, uint32_t i) const {
  uint64_t total = 0;
  for (const auto& shard : shards_) total += shard->bytes(id, i);
  return total;
}

void Counters::read(int id, uint32_t start, uint32_t stop, std::vector<uint64_t>& packets,
                    std::vector<uint64_t>& bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  packets.clear();
  bytes.clear();
  for (uint32_t i = start; i < stop; ++i) {
    packets.push_back(sum_packets(id, i) - base_packets_[id][i]);
    bytes.push_back(sum_bytes(id, i) - base_bytes_[id][i]);
  }
}

void Counters::write(int id, uint32_t start, uint32_t stop, const uint64_t* packets,
                     const uint64_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = start; i < stop; ++i) {
    if (packets) base_packets_[id][i] = sum_packets(id, i) - packets[i - start];
    if (bytes) base_bytes_[id][i] = sum_bytes(id, i) - bytes[i - start];
  }
}

void Counters::clear(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = 0; i < counter_size(id); ++i) {
    base_packets_[id][i] = sum_packets(id, i);
    base_bytes_[id][i] = sum_bytes(id, i);
  }
}

}  // namespace hysync::dataplane
