// The switch's state machine (docs/protocol.md §4-§7) in C++: byte for byte what
// softswitch/pipeline.py (the reference model) does, which tests/native holds it to.
//
// Threads: any number of data-plane threads run packets at once. Each owns a CounterShard
// (counters.h). The registers of a slot are guarded by that slot's spinlock, held from the
// latch (step 8) until the output packet is written, so two threads never interleave inside
// one slot's read-modify-write — the unit of atomicity a P4 register action has. Workers of
// a job spread their contributions over many slots, so threads rarely meet on one lock.
// Control-plane changes (a new Tables snapshot, a register reset) take `guard_` exclusively;
// packet batches hold it shared, so a P4Runtime write batch lands between two packet batches.
#pragma once
#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/bytes.h"
#include "dataplane/counters.h"
#include "dataplane/levels.h"
#include "dataplane/tables.h"
#include "hysync_decision.h"
#include "hysync_wire.h"

namespace hysync::dataplane {

// What aggregate() asks its caller to emit (the reference model's REPLY / MULTICAST; at a
// leaf also UPLINK, its sum to the spine, and MULTICAST_BITMAP, to the replicas of the group
// whose workers' bits the packet's bitmap holds).
enum class Emit : uint8_t { NONE, REPLY, MULTICAST, UPLINK, MULTICAST_BITMAP };

struct Verdict {
  Emit kind;
  uint32_t group;   // MULTICAST*: the job's multicast group; UPLINK: the job
  std::size_t len;  // bytes written to the output buffer
};

// A frame the switch builds: Ethernet + IPv4 + UDP + one full HySync packet.
inline constexpr std::size_t MAX_OUT_FRAME = wire::HYSYNC_OFFSET + wire::PACKET_BYTES;

class Pipeline {
 public:
  explicit Pipeline(uint32_t num_slots = wire::NUM_SLOTS);
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  uint32_t num_slots() const { return num_slots_; }
  Counters& counters() { return counters_; }

  // ------------------------------------------------------------ control plane
  void set_tables(std::shared_ptr<const Tables> tables);
  void reset_registers();  // power-on state: every register zero
  // One register cell by the reference model's name (`round`, `member_seq`, `up_pending`...):
  // slot registers are indexed by slot, member ones by slot * MAX_WORKERS + worker.
  uint32_t read_register(const std::string& name, std::size_t index);
  // A member cell (member_seq or member_epoch) written as a P4Runtime register write would.
  void write_member_register(const std::string& name, std::size_t index, uint32_t value);

  // --------------------------------------------------------------- data plane
  // Held (shared) around a batch of packets; tables() is valid while it is held. A waiting
  // control-plane change goes first: glibc's rwlock prefers readers, and data-plane threads
  // that take turns holding it would otherwise starve a P4Runtime write.
  std::shared_lock<std::shared_mutex> batch_guard() const {
    while (writers_waiting_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    return std::shared_lock<std::shared_mutex>(guard_);
  }
  const Tables& tables() const { return *tables_; }

  // Steps 1-10 of §4 for one UDP payload on the HySync port. Writes the packet to emit (if
  // any) into `out`, which holds PACKET_BYTES.
  Verdict aggregate(CounterShard& c, const Tables& t, const uint8_t* payload, std::size_t size,
                    uint32_t src_ip, uint16_t src_port, uint64_t nbytes, uint8_t* out);

  // A datagram that arrived on the UDP data plane: sink(dst_ip, dst_port, data, len) for
  // every datagram the switch sends. `scratch` holds PACKET_BYTES.
  template <class Sink>
  void process_datagram(CounterShard& c, const Tables& t, uint32_t src_ip, uint16_t src_port,
                        const uint8_t* payload, std::size_t size, uint8_t* scratch, Sink&& sink);

  // One Ethernet frame in on `port`: sink(egress_port, data, len) for every frame out.
  // `scratch` holds MAX_OUT_FRAME.
  template <class Sink>
  void process_frame(CounterShard& c, const Tables& t, uint16_t port, const uint8_t* frame,
                     std::size_t size, uint8_t* scratch, Sink&& sink);

 private:
  struct alignas(64) Slot {
    std::atomic<bool> locked{false};
    uint32_t epoch = 0;      // the install epoch of the job that used the slot last
    bool res_valid = false;  // res_* and the other bank hold a round of this epoch
    uint32_t round = 0, count = 0, bitmap = 0, chunk = 0, mode = 0, quorum = 0;
    uint32_t res_bitmap = 0, res_count = 0, res_chunk = 0, res_mode = 0, res_quorum = 0;
  };
  class SlotLock;

  void start_afresh(Slot& slot, uint32_t s, uint32_t epoch);
  // The config of `job` where `s` is one of its slots here; else the packet is dropped
  // (NO_JOB or SLOT_RANGE) and the answer is null.
  const JobConfig* job_of_slot(CounterShard& c, const Tables& t, uint16_t job, uint16_t s,
                               uint64_t nbytes);
  uint32_t& member_cell(const std::string& name, std::size_t index);
  // Two levels (docs/protocol.md §11), in levels.cc.
  Verdict verdict(CounterShard& c, const Tables& t, const JobRole& role, const uint8_t* p,
                  std::size_t size, uint32_t src_ip, uint64_t nbytes, uint8_t* out);
  Verdict spine_result(CounterShard& c, Slot& slot, const JobRole& role, const uint8_t* p,
                       uint32_t epoch, uint32_t group, uint64_t nbytes, uint8_t* out);
  Verdict spine_resync(CounterShard& c, Slot& slot, const uint8_t* p, uint32_t epoch,
                       uint32_t group, uint64_t nbytes, uint8_t* out);
  Verdict level_update(CounterShard& c, Slot& slot, const JobRole& role, decision::Emit emit,
                       const uint8_t* p, uint32_t s, uint16_t job, uint8_t wk, uint32_t group,
                       uint32_t cur, uint32_t bank, uint32_t chunk, uint32_t count,
                       uint32_t bit, uint8_t version, uint64_t nbytes, uint8_t* out);
  Verdict close_up(CounterShard& c, Slot& slot, const JobRole& role, uint32_t s, uint16_t job,
                   uint8_t wk, uint32_t cur, uint32_t chunk, uint32_t count, uint32_t bitmap,
                   uint8_t version, uint64_t nbytes, uint8_t* out);
  Verdict uplink(const Slot& slot, const JobRole& role, uint32_t s, uint16_t job,
                 uint8_t version, bool retransmit, uint8_t* out);
  Verdict pending_round(CounterShard& c, Slot& slot, const JobRole& role, uint32_t s,
                        uint16_t job, uint8_t wk, uint32_t r, uint8_t version, uint8_t echo,
                        uint32_t epoch, uint64_t nbytes, uint8_t* out);
  void refuse_unless_later(std::size_t seq_index, uint32_t r, uint32_t epoch);
  void refuse_hosts(uint32_t s, uint32_t hosts, uint32_t r, uint32_t epoch);

  void drop(CounterShard& c, uint32_t job, wire::DropReason reason, uint64_t nbytes);
  Verdict close(CounterShard& c, Slot& slot, uint32_t s, uint16_t job, uint8_t w,
                uint32_t group, uint32_t cur, uint32_t bank, uint32_t chunk, uint32_t count,
                uint32_t bitmap, uint8_t version, uint64_t nbytes, uint8_t* out);
  // Replies echo the contribution's transmission number (echo = its flags & TX_MASK).
  std::size_t resync(const Slot& slot, uint32_t s, uint8_t version, uint16_t job, uint8_t w,
                     uint8_t echo, wire::ResyncReason reason, uint8_t* out) const;
  void put_lanes(uint32_t bank, uint8_t* out) const;
  // Count a RESULT for each replica of `group` that has a rewrite; visit(replica) for each.
  // `filtered`: only the replicas whose worker's bit `only` holds (MULTICAST_BITMAP).
  template <class Visit>
  void replicate(CounterShard& c, const Tables& t, uint32_t group, uint64_t nbytes,
                 Visit&& visit, uint32_t only = 0, bool filtered = false);

  uint32_t num_slots_;
  std::vector<Slot> slots_;
  std::vector<LevelSlot> levels_;     // per slot, beside slots_ (guarded by its lock)
  std::vector<int32_t> lanes_;        // 2 banks x LANES per slot, host order
  std::vector<uint32_t> member_seq_;    // slot * MAX_WORKERS + worker
  std::vector<uint32_t> member_epoch_;  // the epoch member_seq_ counted in, or its complement: refused
  Counters counters_;
  std::unique_lock<std::shared_mutex> exclusive();
  mutable std::shared_mutex guard_;
  std::atomic<int> writers_waiting_{0};
  std::shared_ptr<const Tables> tables_;
};

// A slot's spinlock: held for one packet's few hundred nanoseconds. Yields after a while so
// that a lock holder preempted on an oversubscribed machine gets the core back.
class Pipeline::SlotLock {
 public:
  explicit SlotLock(Slot& slot) : flag_(slot.locked) {
    for (unsigned spins = 0; flag_.exchange(true, std::memory_order_acquire);) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins % 128 == 0) {
          sched_yield();
        } else {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        }
      }
    }
  }
  ~SlotLock() { flag_.store(false, std::memory_order_release); }
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;

 private:
  std::atomic<bool>& flag_;
};

// ------------------------------------------------------------------ helpers
void put_header(uint8_t* o, uint8_t version, uint8_t op, uint8_t flags, uint32_t mode,
                uint16_t job, uint8_t worker, uint32_t count, uint16_t slot, uint8_t reason,
                uint32_t quorum, uint32_t round, uint32_t chunk, uint32_t bitmap);
uint16_t ipv4_checksum(const uint8_t* header);
// What a RESULT or an ACK carries in `reason`: the low byte of the install epoch.
uint8_t install_tag(uint32_t epoch);
// A switch-generated frame around the datagram already at out + HYSYNC_OFFSET: IPv4 fields
// copied from the trigger's header `ip_in`, lengths and checksum new (pipeline.py's _build).
void build_frame(uint8_t* out, const uint8_t* src_mac, uint64_t dst_mac, const uint8_t* ip_in,
                 uint32_t src_ip, uint32_t dst_ip, uint16_t dst_port, std::size_t datagram_len);

template <class Visit>
void Pipeline::replicate(CounterShard& c, const Tables& t, uint32_t group, uint64_t nbytes,
                         Visit&& visit, uint32_t only, bool filtered) {
  auto it = t.groups.find(group);
  if (it == t.groups.end()) return;
  for (const Replica& r : it->second) {
    if (filtered && !(only >> (r.rid + wire::MAX_WORKERS - 1) % wire::MAX_WORKERS & 1)) continue;
    if (!r.has_rewrite) continue;
    // rid 0 counts in the last cell, as the reference model's index -1 does.
    c.count(RESULTS, r.rid == 0 ? MEMBER_CELLS - 1 : r.rid - 1, nbytes);
    visit(r);
  }
}

inline uint32_t member_of(const uint8_t* datagram) {
  return uint32_t(load_be16(datagram + wire::OFF_JOB_ID)) * wire::MAX_WORKERS +
         datagram[wire::OFF_WORKER_ID];
}

template <class Sink>
void Pipeline::process_datagram(CounterShard& c, const Tables& t, uint32_t src_ip,
                                uint16_t src_port, const uint8_t* payload, std::size_t size,
                                uint8_t* scratch, Sink&& sink) {
  const uint64_t nbytes = wire::HYSYNC_OFFSET + size;
  Verdict v = aggregate(c, t, payload, size, src_ip, src_port, nbytes, scratch);
  if (v.kind == Emit::NONE) return;
  const uint64_t out_bytes = wire::HYSYNC_OFFSET + v.len;
  if (v.kind == Emit::REPLY) {
    if (scratch[wire::OFF_OP] == uint8_t(wire::Op::RESULT))
      c.count(RESULTS, member_of(scratch), out_bytes);
    sink(src_ip, src_port, scratch, v.len);
    return;
  }
  if (v.kind == Emit::UPLINK) {
    sink(t.roles.at(v.group).spine_addr, wire::HYSYNC_UDP_PORT, scratch, v.len);
    return;
  }
  replicate(
      c, t, v.group, out_bytes,
      [&](const Replica& r) { sink(r.rewrite.ip, r.rewrite.port, scratch, v.len); },
      load_be32(scratch + wire::OFF_BITMAP), v.kind == Emit::MULTICAST_BITMAP);
}

template <class Sink>
void Pipeline::process_frame(CounterShard& c, const Tables& t, uint16_t port,
                             const uint8_t* frame, std::size_t size, uint8_t* scratch,
                             Sink&& sink) {
  namespace w = wire;
  const uint64_t nbytes = size;
  // The P4 parser: Ethernet, IPv4 without options carrying UDP, UDP to the HySync port.
  if (size < w::ETH_BYTES) return drop(c, 0, w::DropReason::MALFORMED, nbytes);
  bool hysync = false;
  if (load_be16(frame + 12) == w::ETHERTYPE_IPV4) {
    if (size < w::ETH_BYTES + w::IPV4_BYTES) return drop(c, 0, w::DropReason::MALFORMED, nbytes);
    const uint8_t* ip = frame + w::ETH_BYTES;
    if (ip[0] == 0x45 && ip[9] == w::IPPROTO_UDP) {
      if (size < w::HYSYNC_OFFSET) return drop(c, 0, w::DropReason::MALFORMED, nbytes);
      hysync = load_be16(frame + w::ETH_BYTES + w::IPV4_BYTES + 2) == w::HYSYNC_UDP_PORT;
    }
  }
  if (!hysync) {  // §7: L2 forwarding
    auto hit = t.l2.find(uint64_t(load_be16(frame)) << 32 | load_be32(frame + 2));
    if (hit != t.l2.end()) return sink(hit->second, frame, size);
    auto flood = t.groups.find(w::FLOOD_MCAST_GROUP);
    if (flood == t.groups.end()) return;
    for (const Replica& r : flood->second)
      if (r.port != port) sink(r.port, frame, size);
    return;
  }
  const uint8_t* ip = frame + w::ETH_BYTES;
  const uint8_t* payload = frame + w::HYSYNC_OFFSET;
  std::size_t len = size - w::HYSYNC_OFFSET;
  const uint32_t src_ip = load_be32(ip + 12);
  const uint16_t src_port = load_be16(frame + w::ETH_BYTES + w::IPV4_BYTES);
  if (len >= w::PACKET_BYTES && payload[w::OFF_OP] == uint8_t(w::Op::CONTRIB) &&
      payload[w::OFF_VERSION] == w::VERSION &&
      (load_be16(ip + 2) != w::IPV4_BYTES + w::UDP_BYTES + w::PACKET_BYTES ||
       load_be16(frame + 38) != w::UDP_BYTES + w::PACKET_BYTES ||
       size != w::HYSYNC_OFFSET + w::PACKET_BYTES))
    return drop(c, load_be16(payload + w::OFF_JOB_ID), w::DropReason::BAD_LENGTH, nbytes);
  // The parser extracts one header, plus the lanes for CONTRIB and RESULT; the rest is unread.
  const uint8_t op = len >= 2 ? payload[w::OFF_OP] : 0;
  const bool has_lanes = op == uint8_t(w::Op::CONTRIB) || op == uint8_t(w::Op::RESULT);
  const std::size_t parsed = has_lanes ? w::PACKET_BYTES : w::HEADER_BYTES;
  if (len > parsed) len = parsed;
  uint8_t* out = scratch + w::HYSYNC_OFFSET;
  Verdict v = aggregate(c, t, payload, len, src_ip, src_port, nbytes, out);
  if (v.kind == Emit::NONE) return;
  const uint64_t out_len = w::HYSYNC_OFFSET + v.len;
  if (v.kind == Emit::REPLY) {
    if (out[w::OFF_OP] == uint8_t(w::Op::RESULT)) c.count(RESULTS, member_of(out), out_len);
    const uint64_t src_mac = uint64_t(load_be16(frame + 6)) << 32 | load_be32(frame + 8);
    build_frame(scratch, frame, src_mac, ip, load_be32(ip + 16), src_ip, src_port, v.len);
    return sink(port, scratch, out_len);
  }
  if (v.kind == Emit::UPLINK) {  // the controller installs the spine's L2 entry with the role
    const JobRole& role = t.roles.at(v.group);
    auto hit = t.l2.find(role.spine_mac);
    if (hit == t.l2.end()) return;
    build_frame(scratch, frame, role.spine_mac, ip, role.leaf_addr, role.spine_addr,
                w::HYSYNC_UDP_PORT, v.len);
    return sink(hit->second, scratch, out_len);
  }
  replicate(
      c, t, v.group, out_len,
      [&](const Replica& r) {
        build_frame(scratch, frame, r.rewrite.mac, ip, load_be32(ip + 16), r.rewrite.ip,
                    r.rewrite.port, v.len);
        sink(r.port, scratch, out_len);
      },
      load_be32(out + w::OFF_BITMAP), v.kind == Emit::MULTICAST_BITMAP);
}

}  // namespace hysync::dataplane
