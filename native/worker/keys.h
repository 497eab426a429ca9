// Keys and their residuals: the registered tensors, each a range of global chunk ids, the
// residual each carries from call to call (the engine is its one owner: docs/design.md), what
// was applied for each since its last call, and RULE B - what each chunk keeps as residual once
// its fate is known (docs/protocol.md §9).
//
// The key's path, from the hook to the wire (the one place it is listed; each step is one
// function below):
//   the key's name, a string: the DDP hook's bucket_key(bucket.index()), or any caller's name;
//     Transport hands it to the engine as it is, and the engine keeps the key under it
//     (Keys::find / Keys::name_key; a size change gives the name a new range)
//   -> its chunks: local chunk l of the key is global chunk first + l (Key::chunk_id), the
//      `chunk` field on the wire; every member registers the same names, with the same sizes,
//      in the same order, so the ranges agree across the job
//   -> the slot that carries it: chunk % W of the job's W slots (slot_of), slot_base + that
//      on the wire (wire_slot); a slot aggregates one chunk at a time, round after round
//   -> in the switch, the slot's register bank for the round's parity, 2 * slot + (round & 1)
//      (register_bank in common/banks.h; docs/protocol.md §4).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/banks.h"
#include "worker/config.h"
#include "worker/flight.h"
#include "worker/quantize.h"

namespace hysync::worker {

struct Call;
struct EngineStats;

// The slot of `window` that carries global `chunk`, and that slot's number on the wire.
inline uint32_t slot_of(uint32_t chunk, uint32_t window) { return chunk % window; }
inline uint16_t wire_slot(const EngineConfig& config, uint32_t i) {
  return uint16_t(config.slot_base + i);
}

// A registered tensor: its name, chunk range, residual (RULE B; the engine keeps it from call
// to call) and what was applied for it since its last call (output units, allocated on the
// first result).
struct Key {
  std::string name;
  int64_t numel = 0, chunks = 0;
  uint32_t first = 0;
  bool alive = true;
  // Per local chunk: the number of round results the engine had applied (Keys::apply) when
  // the latest result of this chunk was applied; 0: none yet. Every member applies every
  // result (RULE A), so the order of these is the same at every member: a partial call sends
  // a slot's chunks of the key least recently closed first (Flights::order_queue).
  std::vector<uint64_t> closed;
  std::vector<float> residual;  // chunks * LANES, float32 per element; kept across calls
  std::vector<float> acc;       // empty, or chunks * LANES

  uint32_t chunk_id(int64_t local) const { return first + uint32_t(local); }
  int64_t local_of(uint32_t chunk) const { return int64_t(chunk) - int64_t(first); }
  // The key's first local chunk that slot i of `window` carries (>= chunks: none); the others
  // follow every `window` chunks.
  int64_t first_local_on(uint32_t i, uint32_t window) const {
    return (int64_t(i) - int64_t(slot_of(first, window)) + window) % window;
  }
};

class Keys {
 public:
  Keys(const EngineConfig& config, const Quantizer& quantizer, EngineStats& stats)
      : cfg_(config), quantizer_(quantizer), stats_(stats) {}

  // The live key named `name`, or -1.
  int find(const std::string& name) const;
  // The key named `name` of numel elements: the one registered, or a new one with the next
  // chunk range. A name registered with another size gets a new range (every member sees the
  // same change, e.g. DDP rebuilding its buckets); the old key is retired with its residual,
  // and *was_numel says its size (else -1).
  int name_key(const std::string& name, int64_t numel, int64_t* was_numel);
  Key& at(int index) { return *keys_.at(std::size_t(index)); }
  const Key& at(int index) const { return *keys_.at(std::size_t(index)); }
  int count() const { return int(keys_.size()); }
  int owner(uint32_t chunk) const;  // the key whose range holds `chunk`, or -1
  int live_owner(uint32_t chunk) const;  // the same, -1 for a retired key
  // What was applied for a key since its last call, into out (numel floats); zeroes it.
  void take(int index, float* out);
  // A result's average (lanes in fixed point) for global `chunk`, added to its key's output:
  // straight into the call's buffer for a chunk of `call` already prepared. A chunk no key
  // owns yet is held until one does; false: too many such chunks held, the result is dropped.
  // `round_result`: a RESULT every member applies (not an ACK's own lanes): it marks the
  // chunk closed (Key::closed).
  bool apply(uint32_t chunk, const double* avg, Call* call, bool round_result);

  // RULE B for the call's chunks.
  // Quantize gradient + residual for the chunk's first transmission; the residual becomes the
  // error, the chunk's rows of the call's buffer its output.
  void prepare_chunk(Call& call, int64_t local, int32_t* fixed, float* err);
  // The fate of a chunk is known: INCLUDED or CARRIED (with the flight that carried it, and
  // the result of the round it missed, if any).
  void settle(Call& call, int64_t local, Outcome outcome, const Flight* f,
              const uint8_t* round = nullptr);
  // The call ends: count the outcomes, and carry what was never sent.
  void finish(Call& call);
  // A residual-only packet takes a chunk's residual (zeros for a chunk of `call` still to be
  // sent, which carries it itself); return_residual gives back what stays due, restore what a
  // parked contribution carried when it turns out not counted.
  void take_residual(int key, int64_t local, float* amount, Call* call);
  void return_residual(const Flight& f, bool included, const uint8_t* round = nullptr);
  void restore(const Flight& f, const uint8_t* round = nullptr);

  // Results held for chunk ids no key owns yet: at most this many chunks (32 MiB); beyond,
  // garbage could grow them without bound.
  static constexpr std::size_t MAX_ORPHANS = 65536;

 private:
  int add_key(const std::string& name, int64_t numel);
  float* output_row(uint32_t chunk, Call* call, bool round_result);
  void chunk_value(const Call& call, int64_t local, float* value) const;
  void open_output(Call& call, int64_t local);
  void carry_unsent(Call& call, int64_t local);
  void close_chunk(Call& call, int64_t local);
  bool absorbed(const Flight& f, const uint8_t* round, std::size_t j) const;

  const EngineConfig& cfg_;
  const Quantizer& quantizer_;
  EngineStats& stats_;
  std::vector<std::unique_ptr<Key>> keys_;
  std::vector<uint32_t> starts_;
  std::unordered_map<std::string, int> names_;  // name -> its live key
  uint64_t round_results_ = 0;                   // round results applied (Key::closed)
  int64_t next_chunk_ = 0;
  // Results held for chunk ids no key owns yet (a peer registered a key first).
  std::unordered_map<uint32_t, std::array<double, LANES>> orphans_;
};

}  // namespace hysync::worker
