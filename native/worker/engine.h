// The worker's transport engine: the whole protocol of docs/protocol.md §9 (RULE A / RULE B,
// sync / partial / async, parking, resync tracking); worker/transport.py is its Python face.
// One thread calls it at a time, without the GIL: it touches no Python object. Python keeps the
// meaning (configuration, keys by name, errors, logs, CallStats).
#pragma once
#include <netinet/in.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/udp_batch.h"
#include "hysync_wire.h"
#include "worker/quantize.h"
#include "worker/recent_max.h"

namespace hysync::worker {

double monotonic_now();

constexpr std::size_t LANES = wire::LANES;
constexpr std::size_t P = wire::PACKET_BYTES;

struct EngineConfig {
  uint32_t job_id = 1, worker_id = 0;
  sockaddr_in switch_addr{};
  uint32_t slot_base = 0, slot_count = 64;
  int members = 1;
  double scale = 1 << 20;
  double rto_initial = 0.02, rto_min = 0.002, rto_max = 0.5;
  double dead_after = 5.0, stall_after = 0.005, missed_after = 0.25, join_after = 0.2;
  float staleness_decay = 1.0f;
  uint64_t seed = 0;
  // Test only (tests/sim/test_races.py): act on every reply as if it answered the latest
  // transmission, the protocol before the transmission-number echo (§9, "Swap storms").
  bool test_only_ignore_echo = false;
  // Test only (tests/sim/test_races.py): never send a displaced chunk again (send_chased),
  // the protocol before it.
  bool test_only_no_chase = false;
  // Test only (tests/sim/test_races.py): the quantizer pins what overflows at the bound and
  // sends NaN as 0, the rule before the overflow sentinel.
  bool test_only_pin_overflow = false;
  // Mutation, simulation only (tests/sim/test_mutations.py): never act on a sign that the
  // switch's state for the job is new (§9, "A switch that lost the job's state"): no abort,
  // no resync flag, the slots keep their rounds.
  bool test_only_no_restart_detection = false;
  // Mutation, simulation only: no per-packet deadline (waited_too_long); only silence fails
  // a call.
  bool test_only_no_flight_deadline = false;
  // Mutation, simulation only: an abort keeps the datagrams queued and not yet sent
  // (drop_flights), so the new switch state may count what the residual holds again.
  bool test_only_send_dropped = false;
};

// What one call (or one poll between calls) did: CallStats' counters.
struct EngineStats {
  uint64_t included = 0, carried = 0, residual_contribs = 0, null_contribs = 0, own_applied = 0,
           retransmits = 0, parked = 0, parked_missed = 0, acks = 0, duplicate_results = 0,
           stray_replies = 0, bad_datagrams = 0, joins = 0;
  uint64_t uneven_results = 0;  // results applied that are not a sync round of every member
  uint64_t resent = 0;  // parked packets sent again without a timeout (hurry, parking)
  uint64_t resyncs[5] = {0, 0, 0, 0, 0};  // by ResyncReason
  double waited_s = 0;  // blocked until the switch replied (or a timer fell due)
  QuantStats quant;
  std::vector<uint8_t> results;  // the header of every result applied, HEADER_BYTES each
  // Sentinels of mine absorbed by a non-finite round (settle(), prepare_chunk()): chunk * 64 +
  // lane each (the simulation's books; CallStats counts them).
  std::vector<uint64_t> absorbed;
};

// A registered tensor: its chunk range, residual (RULE B) and what was applied for it since
// its last call (output units, allocated on the first result).
struct Key {
  int64_t numel = 0, chunks = 0;
  uint32_t first = 0;
  bool alive = true;
  std::vector<float> residual;  // chunks * LANES, float32 per element
  std::vector<float> acc;       // empty, or chunks * LANES
};

enum class Outcome : int8_t { PENDING, INCLUDED, CARRIED, SETTLED };
enum class Kind : uint8_t { OWN, RESIDUAL, NULLS };  // my chunk, a residual, zeros

// What a flight knows besides its bytes. Engine::new_flight() reuses ended flights and resets
// only this part: launch writes the header, the sender the lanes and what err and amount hold
// for its kind (a NULLS flight's zero lanes included).
struct FlightState {
  Kind kind = Kind::OWN;
  int key = -1;  // index into keys_, -1 for NULLS
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
  bool chase = false;  // RESIDUAL: a chunk a sync round of another chunk displaced (send_chased)
  uint8_t tx = 0;     // the number of its latest transmission, which replies echo
  double launched = 0, sent_at = 0, backoff = 0;
  uint64_t sent_seq = 0;  // the worker's transmissions counted at its latest one
  int tries = 0;
  uint64_t gen = 0;
  bool stale = false;  // a STALE reply under its grace period
  uint8_t stale_reason = 0, stale_mode = 0;
  bool early_look = false;  // partial: its first timer is stall_after's look (expire)
  bool closed = false;  // its round was seen closed without me
  uint32_t closed_chunk = 0;
};

// The one packet in flight on a slot; it owns its bytes.
struct Flight : FlightState {
  std::array<uint8_t, P> data{};  // the datagram, header and big-endian lanes
  std::array<float, LANES> err{};   // quantization error of what it carries
  std::array<float, LANES> amount{};  // RESIDUAL: the residual it took; parked OWN: what it adds
  int32_t lane(std::size_t j) const;
};

// PENDING: step() only. RESET: the switch answered from state that is new to this worker (it
// restarted, or the job was installed again); the call aborted as UNREACHABLE's does.
enum class CallStatus { DONE, UNREACHABLE, INTERRUPTED, PENDING, RESET };

class Engine {
 public:
  // fd < 0: the in-memory backend. A deterministic driver (tests/sim) owns the clock
  // (set_time) and the network (take_sent, on_datagram); nothing reads the wall clock.
  Engine(const EngineConfig& config, int fd);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Keys: returns the key's index; a known key of another size gets a new chunk range.
  int register_key(int64_t numel);
  void retire_key(int index);  // its name now maps to another range
  Key& key(int index) { return *keys_.at(std::size_t(index)); }
  int key_count() const { return int(keys_.size()); }

  // Contribute `values` (numel float32) under key `index`; the output (what was applied for the
  // key) replaces them in place. UNREACHABLE: nothing heard for dead_after; the call's chunks
  // are kept as residual and the replica needs a resync.
  CallStatus allreduce(int index, float* values, int64_t numel);
  // Asked about ten times a second while a call or a poll waits; true ends it (the call as
  // UNREACHABLE's abort does, returning INTERRUPTED): how Ctrl-C reaches a long native call.
  void set_interrupt_check(std::function<bool()> check) { interrupted_ = std::move(check); }
  // What was applied for a key since its last call, into out (numel floats); zeroes it.
  void take(int index, float* out);
  // For a caller that owns a key's residual between its calls (worker/ddp_hook.py's state, which
  // pickles it): give_residual adds `in` (numel floats) into the key's residual before a call,
  // export_residual moves it into `out` after one (the engine keeps zeros). Residual-only packets
  // still in flight add back into the engine's copy, which the next give/export pair carries; one
  // sent for the key between its calls carries only that copy (what the owner holds rides on the
  // key's next call instead: later, never lost).
  void give_residual(int index, const float* in);
  void export_residual(int index, float* out);
  // Between calls: serve the socket for `duration` seconds (results, retransmissions).
  CallStatus poll(double duration);
  // The steps of allreduce, for a driver that feeds datagrams itself (the fuzz target): start
  // a call (sends the first window), is every chunk's fate known, finish it (RULE B, output).
  void begin_call(int index, float* values, int64_t numel);
  bool call_done() const;
  void end_call();
  // One received datagram, as the receive loop handles it; timers that fell due by `now`.
  void on_datagram(const uint8_t* data, std::size_t size, double now);
  void tick(double now);
  // One turn of a call's loop at `now` (allreduce runs it between waits): timers, JOINs,
  // sends, the dead check. DONE ends the call (end_call done); UNREACHABLE and RESET abort it;
  // else PENDING, with nothing to do before next_wake() unless a datagram arrives.
  CallStatus step(double now);
  double next_wake() const;
  // The in-memory backend: the clock's time, and the datagrams sent since the last take.
  void set_time(double now) { sim_now_ = now; }
  std::vector<std::vector<uint8_t>> take_sent();
  // Why the last call aborted with RESET ("" if it did not).
  const std::string& reset_why() const { return reset_why_; }

  // Safe to read from another thread while a call runs.
  bool needs_resync() const { return resync_flagged_ || missed_results_ > 0; }
  void clear_resync();
  uint64_t missed_results() const { return missed_results_; }
  uint64_t bad_datagrams() const { return bad_datagrams_; }
  int in_flight() const { return inflight_; }
  EngineStats& stats() { return stats_; }
  void reset_stats() { stats_ = EngineStats(); }
  double srtt() const { return srtt_; }  // < 0: no sample yet
  double rto() const { return rto_; }
  std::vector<int> slot_modes() const { return mode_; }
  std::string describe_flights() const;
  const Flight* flight(uint32_t i) const { return flight_.at(i).get(); }  // null: slot idle
  uint32_t window() const { return w_; }
  // Log lines since the last call: (level, message), level 30 = warning, 20 = info.
  std::vector<std::pair<int, std::string>> take_logs();

 public:
  using KeptResult = std::array<uint8_t, 8 + 4 * LANES>;  // a RESULT's round, chunk and lanes

 private:
  struct Call;
  struct Timer {
    double at;
    uint64_t gen;
    uint32_t slot;
    bool extended = false;  // re-armed once already because it fired late (expire())
    bool operator>(const Timer& o) const { return at > o.at || (at == o.at && gen > o.gen); }
  };

  // receiving
  double read_before_timeouts(double now);
  void drain();
  std::size_t receive();  // one recvmmsg; returns the messages read (RECV_BATCH: maybe more)
  void bad(const std::string& reason);
  void on_full(const uint8_t* d, double now);
  void on_short(const uint8_t* d, std::size_t size, double now);
  void on_ack(uint32_t i, uint32_t rnd, uint32_t chunk, double now);
  void on_resync(uint32_t i, uint8_t reason, uint32_t rnd, uint32_t chunk, uint8_t mode,
                 uint32_t count, uint8_t flags, double now);
  bool answers_latest(uint32_t i, uint8_t flags) const;
  bool seen_own_result(uint32_t i, const uint8_t* d) const;
  void keep_own_result(uint32_t i, const uint8_t* d);
  void decide_stale(uint32_t i, double now);
  void counted_without_result(uint32_t i, double now);
  void retarget(uint32_t i, uint32_t chunk, uint32_t rnd, uint8_t mode, double now);
  void apply(const uint8_t* d);
  double divisor(uint8_t mode, uint8_t count) const;
  double lane_share(int32_t sum, double share) const;
  void add(uint32_t chunk, const double* avg);
  float* acc_row(uint32_t chunk);
  // sending
  void send_next(uint32_t i, double now);
  void send_chased(uint32_t i, double now);
  void chase(uint32_t i, uint32_t chunk);
  void send_own(uint32_t i, int64_t local, const uint32_t* rnd, double now);
  void send_extra(uint32_t i, Kind kind, int key, uint32_t chunk, uint32_t rnd, double now,
                  bool join = false);
  void join_idle_slots(double now);
  void offer_join(uint32_t i, double now);
  void launch(uint32_t i, const uint32_t* rnd, double now);
  void transmit(uint32_t i, double now, bool retransmit, bool timeout = true);
  bool holdable(uint32_t i) const;
  void flush();
  uint32_t next_seq(uint32_t i);
  // timers
  void expire(double now);
  bool silent_flight(uint32_t i) const;
  uint32_t longest_silent(uint32_t i) const;
  void park(uint32_t i);
  void hold_queue(uint32_t i, double now);
  void hurry(uint32_t i, double now);
  void follow_mode(uint32_t i, double now);
  void carry_queue(uint32_t i);
  void restore(const Flight& f, const uint8_t* round = nullptr);
  void rtt_sample(uint32_t i, const Flight& f, double now);
  double silence_timeout(double now);
  // outcomes (RULE B)
  // `round`: the RESULT of the very round a carried flight missed (same slot, round and
  // chunk), whose lanes absorb the flight's sentinels where its sum is non-finite already.
  void done(uint32_t i, bool included, double now, bool send_next_chunk = true,
            const uint8_t* round = nullptr);
  std::unique_ptr<Flight> new_flight();
  void end_flight(uint32_t i);
  void settle(int64_t local, Outcome outcome, const Flight* f, const uint8_t* round = nullptr);
  void chunk_value(int64_t local, float* value);
  void open_output(int64_t local);
  void prepare_chunk(int64_t local, int32_t* fixed, float* err);
  void carry_unsent(int64_t local);
  void take_residual(int key, int64_t local, float* amount);
  void return_residual(const Flight& f, bool included, const uint8_t* round = nullptr);
  bool absorbed(const Flight& f, const uint8_t* round, std::size_t j) const;
  void apply_own(uint32_t i);
  void finish();
  void close_chunk(int64_t local);
  void abort_call();
  void retire_call();
  void drop_flights();
  // rounds (RULE A)
  void advance(uint32_t i, uint32_t upto);
  bool is_new(uint32_t i, uint32_t rnd);
  void check_suspects();
  void flag_resync(const std::string& why);
  void log_resync(const std::string& why);
  int key_of(uint32_t chunk) const;
  void log(int level, std::string message);

  EngineConfig cfg_;
  Quantizer quantizer_;
  int fd_;
  uint32_t w_, bit_;
  std::vector<uint32_t> next_round_, seq_;
  std::vector<bool> known_;
  // Per slot: chunks (global ids) a sync round of another chunk displaced, to send again as
  // residual when the slot has nothing else to send in a call (send_chased).
  std::vector<std::deque<uint32_t>> chased_;
  // Per slot: round, chunk and lanes of the last async results of mine that settled a flight
  // (none since the slot's rounds were learned), so that a late copy of one is not taken for a
  // sign of new switch state. Several, not the last one only: calls of zero gradients send a
  // chunk's flights with the same lanes, and a copy the network delayed can arrive after two
  // newer results. A copy, not a digest: the receive loop only copies.
  struct OwnResults {
    std::vector<KeptResult> kept;  // at most OWN_RESULT_MEMORY (results.cc), filled lazily
    std::size_t oldest = 0;        // once full: the entry the next one replaces
  };
  std::vector<OwnResults> own_results_;
  std::vector<int> mode_;
  std::vector<uint8_t> tx_number_;  // per slot: the number of the latest transmission (mod 32)
  double progress_at_ = 0, joined_at_ = 0;  // a flight of the call settled; idle slots joined
  std::vector<std::map<uint32_t, double>> suspect_;  // round -> since
  std::vector<std::deque<std::pair<uint32_t, std::array<uint8_t, 4 * LANES>>>> acked_;
  // The entry of acked_[i] that an async RESULT d (count 1, my bit) answers, or end().
  std::deque<std::pair<uint32_t, std::array<uint8_t, 4 * LANES>>>::iterator acked_entry(
      uint32_t i, const uint8_t* d);
  std::vector<uint32_t> suspect_slots_;
  std::vector<std::unique_ptr<Flight>> flight_;
  // Ended flights, reused by new_flight(): a call launches one per chunk, and allocating each
  // (most of a kilobyte, freed in bursts of a window) cost a sixth of the engine's CPU in
  // malloc's bins.
  std::vector<std::unique_ptr<Flight>> spare_flights_;
  int inflight_ = 0;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  uint64_t gen_ = 0;
  std::vector<std::unique_ptr<Key>> keys_;
  std::vector<uint32_t> starts_;
  int64_t next_chunk_ = 0;
  std::unordered_map<uint32_t, std::array<double, LANES>> orphans_;
  double srtt_ = -1, rttvar_ = 0, rto_, backed_off_ = 0;
  double woke_late_ = 0;  // how long past its timeout the call's or poll's last wait woke up
  double probed_at_ = 0;  // the last retransmission into a silent switch (expire())
  // Transmissions counted, and the latest one whose flight's fate is known: the flights
  // sent after it have been overtaken by no answer (silent_flight).
  uint64_t sent_seq_ = 0, answered_seq_ = 0;
  double first_answered_at_ = 0;  // the latest answer to a first transmission
  // How long answers to first transmissions lately waited in silence: the job waiting on one
  // process, not a loss (silence_timeout).
  RecentMax silences_;
  std::atomic<uint64_t> missed_results_{0};
  std::atomic<bool> resync_flagged_{false};
  uint64_t bad_datagrams_ = 0;
  int tag_ = -1;       // the install tag of the switch's state this worker knows (-1: none yet)
  int left_tag_ = -1;  // the one before: its late packets are not taken for a newer state
  // (-1 in tag_ after a reset: the next tag heard is learned)
  double tag_changed_at_ = 0;
  std::string resync_why_;  // what cannot heal: aborts, huge gaps
  std::unique_ptr<Call> call_;
  std::unique_ptr<Call> spare_call_;  // the last call's, reused by the next (Call::start)
  EngineStats stats_;
  double last_rx_;
  DatagramBatch rx_, tx_;
  std::vector<std::pair<int, std::string>> logs_;
  std::function<bool()> interrupted_;
  double checked_at_ = 0;
  bool interrupted(double now);
  double now() const { return fd_ < 0 ? sim_now_ : monotonic_now(); }
  void switch_reset(const std::string& what);
  // RESULT and ACK carry the install tag of the switch's state for the job: false for a
  // packet of a state this worker has left (a new tag resets, see switch_reset).
  bool current_state(uint8_t tag, uint32_t i, const char* what, double now);
  bool silent_too_long(double now) const;
  bool waited_too_long(double now) const;
  double sim_now_ = 0, call_start_ = 0;
  double unanswered_since_ = -1;  // the first packet sent after last_rx_ (dead_after counts)
  double gave_up_at_ = -1;        // the last call given up on a silent switch
  std::vector<std::vector<uint8_t>> outbox_;  // the in-memory backend's sent datagrams
  std::string reset_why_;  // set when a reply shows the switch's state is new; ends the call
};

}  // namespace hysync::worker
