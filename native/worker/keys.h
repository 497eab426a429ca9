// Keys and their residuals: the registered tensors, each a range of global chunk ids, what was
// applied for each since its last call, and RULE B - what each chunk keeps as residual once
// its fate is known (docs/protocol.md §9).
//
// A gradient's names, from the hook to the wire (the one place they are listed):
//   DDP bucket i (worker/ddp_hook.py) -> the transport's key ("bucket", i)
//   -> the engine's key index (Keys::add_key, in registration order; every member registers
//      the same keys in the same order, so indices and chunk ranges agree across the job)
//   -> its chunks: local chunk l of the key is global chunk first + l, the `chunk` field on
//      the wire
//   -> the slot that carries it: (first + l) % W of the job's W slots, slot_base + that on the
//      wire (a slot aggregates one chunk at a time, round after round)
//   -> in the switch, the slot's register bank for the round's parity, 2 * slot + (round & 1)
//      (docs/protocol.md §4).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/config.h"
#include "worker/flight.h"
#include "worker/quantize.h"

namespace hysync::worker {

struct Call;
struct EngineStats;

// A registered tensor: its chunk range, residual (RULE B) and what was applied for it since
// its last call (output units, allocated on the first result).
struct Key {
  int64_t numel = 0, chunks = 0;
  uint32_t first = 0;
  bool alive = true;
  std::vector<float> residual;  // chunks * LANES, float32 per element
  std::vector<float> acc;       // empty, or chunks * LANES
};

class Keys {
 public:
  Keys(const EngineConfig& config, const Quantizer& quantizer, EngineStats& stats)
      : cfg_(config), quantizer_(quantizer), stats_(stats) {}

  // A new key of numel elements: the next chunk range; returns its index.
  int add_key(int64_t numel);
  void retire(int index) { at(index).alive = false; }  // its name now maps to another range
  Key& at(int index) { return *keys_.at(std::size_t(index)); }
  const Key& at(int index) const { return *keys_.at(std::size_t(index)); }
  int count() const { return int(keys_.size()); }
  int owner(uint32_t chunk) const;  // the key whose range holds `chunk`, or -1
  int live_owner(uint32_t chunk) const;  // the same, -1 for a retired key
  // What was applied for a key since its last call, into out (numel floats); zeroes it.
  void take(int index, float* out);
  // A caller that owns a key's residual between its calls (worker/ddp_hook.py's state):
  // give adds `in` into the key's residual before a call, export moves it out after one.
  void give_residual(int index, const float* in);
  void export_residual(int index, float* out);

  // A result's average (lanes in fixed point) for global `chunk`, added to its key's output:
  // straight into the call's buffer for a chunk of `call` already prepared. A chunk no key
  // owns yet is held until one does; false: too many such chunks held, the result is dropped.
  bool apply(uint32_t chunk, const double* avg, Call* call);

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
  float* output_row(uint32_t chunk, Call* call);
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
  int64_t next_chunk_ = 0;
  // Results held for chunk ids no key owns yet (a peer registered a key first).
  std::unordered_map<uint32_t, std::array<double, LANES>> orphans_;
};

}  // namespace hysync::worker
