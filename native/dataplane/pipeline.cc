#include "dataplane/pipeline.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <tuple>

namespace hysync::dataplane {

namespace w = wire;
using w::DropReason;
using w::Op;

bool ModeRange::operator<(const ModeRange& o) const {
  return std::tie(neg_priority, lo, hi, mode, quorum) <
         std::tie(o.neg_priority, o.lo, o.hi, o.mode, o.quorum);
}

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

Pipeline::Pipeline(uint32_t num_slots)
    : num_slots_(num_slots),
      slots_(num_slots),
      lanes_(std::size_t(2) * num_slots * w::LANES),
      // + MAX_WORKERS * 8: a worker id up to 255 stays inside the array (the controller
      // refuses ids >= 32; the reference model would index the next slot's cells too).
      member_seq_(std::size_t(num_slots) * w::MAX_WORKERS + 256),
      member_epoch_(member_seq_.size()),
      tables_(std::make_shared<Tables>()) {}

std::unique_lock<std::shared_mutex> Pipeline::exclusive() {
  writers_waiting_.fetch_add(1, std::memory_order_acq_rel);
  std::unique_lock<std::shared_mutex> lock(guard_);
  writers_waiting_.fetch_sub(1, std::memory_order_acq_rel);
  return lock;
}

void Pipeline::set_tables(std::shared_ptr<const Tables> tables) {
  auto lock = exclusive();
  tables_.swap(tables);
  // The old snapshot is freed after the lock is released (when `tables` goes out of scope).
  lock.unlock();
}

void Pipeline::reset_registers() {
  auto lock = exclusive();
  for (Slot& s : slots_) {
    s.epoch = 0;
    s.res_valid = false;
    s.round = s.count = s.bitmap = s.chunk = s.mode = s.quorum = 0;
    s.res_bitmap = s.res_count = s.res_chunk = s.res_mode = s.res_quorum = 0;
  }
  std::fill(lanes_.begin(), lanes_.end(), 0);
  std::fill(member_seq_.begin(), member_seq_.end(), 0);
  std::fill(member_epoch_.begin(), member_epoch_.end(), 0);
}

// ------------------------------------------------------------------ helpers
// What a RESULT or an ACK carries in `reason` (hysync/wire.py install_tag): the low byte of
// the install epoch its slot's state belongs to.
uint8_t install_tag(uint32_t epoch) { return uint8_t(epoch & 0xFF); }

void put_header(uint8_t* o, uint8_t version, uint8_t op, uint8_t flags, uint32_t mode,
                uint16_t job, uint8_t worker, uint32_t count, uint16_t slot, uint8_t reason,
                uint32_t quorum, uint32_t round, uint32_t chunk, uint32_t bitmap) {
  w::Header h;
  h.version = version;
  h.op = op;
  h.flags = flags;
  h.mode = uint8_t(mode);
  h.job_id = job;
  h.worker_id = worker;
  h.count = uint8_t(count);
  h.slot = slot;
  h.reason = reason;
  h.quorum = uint8_t(quorum);
  h.round = round;
  h.chunk = chunk;
  h.bitmap = bitmap;
  w::store_header(o, h);
}

uint16_t ipv4_checksum(const uint8_t* header) {
  uint32_t total = 0;
  for (std::size_t i = 0; i < w::IPV4_BYTES; i += 2) total += load_be16(header + i);
  while (total >> 16) total = (total & 0xFFFF) + (total >> 16);
  return uint16_t(~total);
}

void build_frame(uint8_t* out, const uint8_t* src_mac, uint64_t dst_mac, const uint8_t* ip_in,
                 uint32_t src_ip, uint32_t dst_ip, uint16_t dst_port, std::size_t datagram_len) {
  store_be16(out, uint16_t(dst_mac >> 32));
  store_be32(out + 2, uint32_t(dst_mac));
  std::memcpy(out + 6, src_mac, 6);
  store_be16(out + 12, w::ETHERTYPE_IPV4);
  uint8_t* ip = out + w::ETH_BYTES;
  std::memcpy(ip, ip_in, w::IPV4_BYTES);
  store_be16(ip + 2, uint16_t(w::IPV4_BYTES + w::UDP_BYTES + datagram_len));
  store_be16(ip + 10, 0);
  store_be32(ip + 12, src_ip);
  store_be32(ip + 16, dst_ip);
  store_be16(ip + 10, ipv4_checksum(ip));
  uint8_t* udp = ip + w::IPV4_BYTES;
  store_be16(udp, w::HYSYNC_UDP_PORT);
  store_be16(udp + 2, dst_port);
  store_be16(udp + 4, uint16_t(w::UDP_BYTES + datagram_len));
  store_be16(udp + 6, 0);
}

static inline uint32_t bswap(uint32_t v) { return __builtin_bswap32(v); }

void Pipeline::put_lanes(uint32_t bank, uint8_t* out) const {
  const int32_t* src = &lanes_[std::size_t(bank) * w::LANES];
  uint32_t tmp[w::LANES];
  for (std::size_t i = 0; i < w::LANES; ++i) tmp[i] = bswap(uint32_t(src[i]));
  std::memcpy(out + w::HEADER_BYTES, tmp, sizeof(tmp));
}

void Pipeline::drop(CounterShard& c, uint32_t job, DropReason reason, uint64_t nbytes) {
  c.count(DROPS, (job < w::MAX_JOBS ? job : 0) * w::NUM_DROP_REASONS + uint32_t(reason), nbytes);
  c.count(SWITCH_DROPS, uint32_t(reason), nbytes);
}

static const ModeRange* desired_mode(const Tables& t, uint32_t job, uint32_t slot) {
  auto it = t.modes.find(job);
  if (it == t.modes.end()) return nullptr;
  for (const ModeRange& m : it->second)
    if (m.lo <= slot && slot <= m.hi) return &m;
  return nullptr;
}

// ------------------------------------------------------------ the state machine
Verdict Pipeline::aggregate(CounterShard& c, const Tables& t, const uint8_t* p, std::size_t size,
                            uint32_t src_ip, uint16_t src_port, uint64_t nbytes, uint8_t* out) {
  constexpr Verdict none{Emit::NONE, 0, 0};
  if (size < w::HEADER_BYTES) return drop(c, 0, DropReason::MALFORMED, nbytes), none;
  const w::Header h = w::load_header(p);
  const uint8_t version = h.version, op = h.op, wk = h.worker_id;
  const uint16_t job = h.job_id, s = h.slot;
  const uint32_t r = h.round, chunk = h.chunk;
  const bool join = h.flags & uint8_t(w::Flag::JOIN);
  const uint8_t echo = h.flags & w::TX_MASK;  // every reply echoes the transmission
  if ((op == uint8_t(Op::CONTRIB) || op == uint8_t(Op::RESULT)) && size < w::PACKET_BYTES)
    return drop(c, job, DropReason::MALFORMED, nbytes), none;
  if (version != w::VERSION) return drop(c, job, DropReason::BAD_VERSION, nbytes), none;
  if (op != uint8_t(Op::CONTRIB)) return drop(c, job, DropReason::BAD_OP, nbytes), none;
  if (size != w::PACKET_BYTES) return drop(c, job, DropReason::BAD_LENGTH, nbytes), none;
  if (!t.members.count(MemberKey{job, wk, src_ip, src_port}))
    return drop(c, job, DropReason::NOT_MEMBER, nbytes), none;
  auto job_it = t.jobs.find(job);
  if (job_it == t.jobs.end()) return drop(c, job, DropReason::NO_JOB, nbytes), none;
  const JobConfig& cfg = job_it->second;
  if (s < cfg.slot_base || s >= uint64_t(cfg.slot_base) + cfg.slot_count || s >= num_slots_)
    return drop(c, job, DropReason::SLOT_RANGE, nbytes), none;

  Slot& slot = slots_[s];
  SlotLock lock(slot);
  if (slot.epoch != cfg.epoch) {  // 8. a slot another install used last starts afresh
    slot.epoch = cfg.epoch;
    slot.round = slot.count = slot.bitmap = slot.chunk = 0;
    slot.res_valid = false;
  }
  if (slot.count == 0) {  // latch the desired mode when no round is under way
    const ModeRange* m = desired_mode(t, job, s);
    slot.mode = m ? m->mode : uint32_t(w::Mode::SYNC);
    slot.quorum = m ? m->quorum : 0;
  }
  const uint32_t member = uint32_t(job) * w::MAX_WORKERS + wk;
  const uint32_t bit = wk < 32 ? 1u << wk : 0;
  const uint32_t cur = slot.round;
  const std::size_t seq_index = std::size_t(s) * w::MAX_WORKERS + wk;
  uint32_t& seq = member_seq_[seq_index];
  uint32_t& seq_epoch = member_epoch_[seq_index];
  const bool counted = seq_epoch == cfg.epoch && seq == r;
  // Step 8's refusal mark: r was answered "not counted" and never will be, should a copy of it
  // meet the slot in another mode (a duplicate behind a swap into async).
  const uint32_t refused_mark = ~cfg.epoch;
  const auto refuse = [&] {
    if (!counted) {
      seq = r;
      seq_epoch = refused_mark;
    }
  };
  const uint8_t* lanes_in = p + w::HEADER_BYTES;
  int32_t* bank_lanes = &lanes_[(2 * std::size_t(s) + (cur & 1)) * w::LANES];

  if (slot.mode == uint32_t(w::Mode::ASYNC)) {  // 10.
    if (counted) {
      drop(c, job, DropReason::DUPLICATE, nbytes);
      c.count(DUPLICATES, member, nbytes);
      put_header(out, version, uint8_t(Op::ACK), echo, slot.mode, job, wk, 0, s,
                 install_tag(slot.epoch), slot.quorum, r, chunk, 0);
      return {Emit::REPLY, 0, w::HEADER_BYTES};
    }
    if (join)  // a JOIN never makes a round of its own
      return not_joined(c, slot, s, version, job, wk, echo, nbytes, out);
    if (seq_epoch == refused_mark && seq == r)  // answered "not counted" before
      return stale(c, slot, s, version, job, wk, echo, member, nbytes, counted, out);
    seq = r;
    seq_epoch = cfg.epoch;
    c.count(CONTRIBUTIONS, member, nbytes);
    for (std::size_t i = 0; i < w::LANES; ++i) bank_lanes[i] = int32_t(load_be32(lanes_in + 4 * i));
    return close(c, slot, s, job, wk, cfg.group, cur, 2 * s + (cur & 1), chunk, 1, bit, version,
                 nbytes, out);
  }

  if (r == cur) {  // 9. the open round
    const uint32_t count = slot.count;
    const uint32_t needed = slot.quorum == 0 ? cfg.members : std::min(slot.quorum, cfg.members);
    if (slot.bitmap & bit) {
      drop(c, job, DropReason::DUPLICATE, nbytes);
      c.count(DUPLICATES, member, nbytes);
      if (count >= needed)  // membership shrank under the round: close it as it is
        return close(c, slot, s, job, wk, cfg.group, cur, 2 * s + (cur & 1), slot.chunk, count,
                     slot.bitmap, version, nbytes, out);
      return none;
    }
    // A JOIN never opens a round; one answered so leaves the JOIN mark (~r under the refusal
    // mark), so that a copy of it that meets the round opened since is refused too. The first
    // JOIN that meets the mark spends it: the worker's next JOIN counts.
    if (join && (count == 0 || (seq_epoch == refused_mark && seq == ~r))) {
      if (count) {
        seq_epoch = 0;
      } else if (!counted) {
        seq = ~r;
        seq_epoch = refused_mark;
      }
      return not_joined(c, slot, s, version, job, wk, echo, nbytes, out);
    }
    if (count && chunk != slot.chunk) {
      drop(c, job, DropReason::CHUNK_MISMATCH, nbytes);
      refuse();
      return {Emit::REPLY, 0,
              resync(slot, s, version, job, wk, echo, w::ResyncReason::CHUNK_MISMATCH, out)};
    }
    c.count(CONTRIBUTIONS, member, nbytes);
    seq = r;
    seq_epoch = cfg.epoch;
    if (count == 0) {
      for (std::size_t i = 0; i < w::LANES; ++i)
        bank_lanes[i] = int32_t(load_be32(lanes_in + 4 * i));
      slot.chunk = chunk;
    } else {
      // Wrapping int32 adds, as the reference model's int32 numpy array and P4's bit<32>.
      for (std::size_t i = 0; i < w::LANES; ++i)
        bank_lanes[i] = int32_t(uint32_t(bank_lanes[i]) + load_be32(lanes_in + 4 * i));
    }
    const uint32_t new_count = count + 1, bitmap = slot.bitmap | bit;
    if (new_count >= needed)
      return close(c, slot, s, job, wk, cfg.group, cur, 2 * s + (cur & 1), slot.chunk,
                   new_count, bitmap, version, nbytes, out);
    slot.count = new_count;
    slot.bitmap = bitmap;
    return none;
  }

  if (r == cur - 1 && slot.res_valid) {  // 9. the round that closed last: resend it
    c.count(slot.res_bitmap & bit ? DUPLICATES : LATE, member, nbytes);
    if (!(slot.res_bitmap & bit)) refuse();
    put_header(out, version, uint8_t(Op::RESULT), uint8_t(w::Flag::RESEND) | echo, slot.res_mode,
               job, wk, slot.res_count, s, install_tag(slot.epoch), slot.res_quorum, r,
               slot.res_chunk, slot.res_bitmap);
    put_lanes(2 * s + (r & 1), out);
    return {Emit::REPLY, 0, w::PACKET_BYTES};
  }

  refuse();
  return stale(c, slot, s, version, job, wk, echo, member, nbytes, counted, out);
}

Verdict Pipeline::stale(CounterShard& c, const Slot& slot, uint32_t s, uint8_t version,
                        uint16_t job, uint8_t wk, uint8_t echo, uint32_t member, uint64_t nbytes,
                        bool counted, uint8_t* out) {
  drop(c, job, DropReason::STALE, nbytes);
  c.count(STALE, member, nbytes);
  const auto reason = counted ? w::ResyncReason::STALE_COUNTED : w::ResyncReason::STALE_ROUND;
  return {Emit::REPLY, 0, resync(slot, s, version, job, wk, echo, reason, out)};
}

Verdict Pipeline::close(CounterShard& c, Slot& slot, uint32_t s, uint16_t job, uint8_t wk,
                        uint32_t group, uint32_t cur, uint32_t bank, uint32_t chunk,
                        uint32_t count, uint32_t bitmap, uint8_t version, uint64_t nbytes,
                        uint8_t* out) {
  c.count(CLOSES, uint32_t(job) * w::MAX_WORKERS + wk, nbytes);
  slot.res_bitmap = bitmap;
  slot.res_count = count;
  slot.res_chunk = chunk;
  slot.res_mode = slot.mode;
  slot.res_quorum = slot.quorum;
  slot.res_valid = true;
  slot.round = cur + 1;
  slot.count = 0;
  slot.bitmap = 0;
  put_header(out, version, uint8_t(Op::RESULT), 0, slot.mode, job, wk, count, uint16_t(s),
             install_tag(slot.epoch), slot.quorum, cur, chunk, bitmap);
  put_lanes(bank, out);
  return {Emit::MULTICAST, group, w::PACKET_BYTES};
}

Verdict Pipeline::not_joined(CounterShard& c, const Slot& slot, uint32_t s, uint8_t version,
                             uint16_t job, uint8_t wk, uint8_t echo, uint64_t nbytes,
                             uint8_t* out) {
  drop(c, job, DropReason::NOT_JOINED, nbytes);
  return {Emit::REPLY, 0,
          resync(slot, s, version, job, wk, echo, w::ResyncReason::NOT_JOINED, out)};
}

std::size_t Pipeline::resync(const Slot& slot, uint32_t s, uint8_t version, uint16_t job,
                             uint8_t wk, uint8_t echo, w::ResyncReason reason,
                             uint8_t* out) const {
  put_header(out, version, uint8_t(Op::RESYNC), echo, slot.mode, job, wk, slot.count, uint16_t(s),
             uint8_t(reason), slot.quorum, slot.round, slot.chunk, slot.bitmap);
  return w::HEADER_BYTES;
}

}  // namespace hysync::dataplane
