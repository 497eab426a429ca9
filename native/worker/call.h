// The call in progress: the key's gradient (whose rows become the output as its chunks are
// prepared), each local chunk's outcome, and the chunks still to send on each slot.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "worker/flight.h"
#include "worker/keys.h"

namespace hysync::worker {

struct Call {
  int key = -1;
  float* values = nullptr;  // the gradient; a chunk's rows become its output once prepared
  int64_t numel = 0;
  std::vector<Outcome> outcome;
  std::vector<uint8_t> prepared;  // quantized: residual holds its error, values its output
  std::vector<std::deque<int64_t>> queues;  // per slot: local chunks still to send
  int64_t remaining = 0;
  std::vector<std::vector<int64_t>> held;  // per slot: carried because a parked packet held it
  // Partial, per slot: chunks of the call that a round of another chunk of the key displaced
  // (CHUNK_MISMATCH), with that round; once it closes they are offered again (Flights::
  // round_closed), as residual, queued with `reoffer` set.
  struct Displaced {
    int64_t local;
    uint32_t round;
  };
  std::vector<std::vector<Displaced>> displaced;
  std::vector<uint8_t> reoffer;  // per local chunk: its place in its slot's queue is a re-offer

  Call(int k, const Key& reg, float* v, int64_t n, uint32_t window) {
    start(k, reg, v, n, window);
  }
  // (Re)starts the call. The engine keeps one Call across calls: the per-slot queues keep
  // their memory, where building W deques afresh took two allocations a slot every call.
  void start(int k, const Key& reg, float* v, int64_t n, uint32_t window) {
    key = k;
    values = v;
    numel = n;
    outcome.assign(std::size_t(reg.chunks), Outcome::PENDING);
    prepared.assign(std::size_t(reg.chunks), 0);
    reoffer.assign(std::size_t(reg.chunks), 0);
    remaining = reg.chunks;
    queues.resize(window);
    held.resize(window);
    displaced.resize(window);
    for (uint32_t i = 0; i < window; ++i) {
      queues[i].clear();
      held[i].clear();
      displaced[i].clear();
      // Slot i carries every window-th chunk of the key from its first there (slot_of).
      for (int64_t l = reg.first_local_on(i, window); l < reg.chunks; l += window)
        queues[i].push_back(l);
    }
  }
  // Local index of global `chunk` if it waits in slot i's queue, else -1.
  int64_t pending(const Key& reg, uint32_t chunk, uint32_t i) const {
    const int64_t local = reg.local_of(chunk);
    if (local < 0 || local >= reg.chunks || outcome[std::size_t(local)] != Outcome::PENDING)
      return -1;
    const auto& q = queues[i];
    return std::find(q.begin(), q.end(), local) != q.end() ? local : -1;
  }
  std::size_t lanes_of(int64_t local) const {  // elements of `values` in this chunk
    return std::size_t(std::clamp<int64_t>(numel - local * int64_t(LANES), 0, LANES));
  }
};

}  // namespace hysync::worker
