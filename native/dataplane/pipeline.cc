#include "dataplane/pipeline.h"

#include "common/banks.h"
#include "hysync_decision.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace hysync::dataplane {

namespace w = wire;
using w::DropReason;
using w::Op;

bool ModeRange::operator<(const ModeRange& o) const {
  return std::tie(neg_priority, lo, hi, mode, quorum) <
         std::tie(o.neg_priority, o.lo, o.hi, o.mode, o.quorum);
}

Pipeline::Pipeline(uint32_t num_slots)
    : num_slots_(num_slots),
      slots_(num_slots),
      levels_(num_slots),
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
  std::fill(levels_.begin(), levels_.end(), LevelSlot{});
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

void Pipeline::put_lanes(uint32_t bank, uint8_t* out) const {
  const int32_t* src = &lanes_[std::size_t(bank) * w::LANES];
  uint32_t tmp[w::LANES];
  for (std::size_t i = 0; i < w::LANES; ++i) tmp[i] = host_be32(uint32_t(src[i]));
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
  if (!t.roles.empty() &&
      (p[w::OFF_OP] == uint8_t(Op::RESULT) || p[w::OFF_OP] == uint8_t(Op::RESYNC))) {
    // A RESULT or RESYNC reaching a leaf of its job is the spine's verdict (§11).
    auto role = t.roles.find(load_be16(p + w::OFF_JOB_ID));
    if (role != t.roles.end() && role->second.level == Level::LEAF)
      return verdict(c, t, role->second, p, size, src_ip, nbytes, out);
  }
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
  const JobConfig* job_cfg = job_of_slot(c, t, job, s, nbytes);
  if (job_cfg == nullptr) return none;
  const JobConfig& cfg = *job_cfg;

  Slot& slot = slots_[s];
  SlotLock lock(slot);
  // 8. a slot another install used last starts afresh
  if (slot.epoch != cfg.epoch) start_afresh(slot, s, cfg.epoch);
  if (slot.count == 0) {  // latch the desired mode when no round is under way
    const ModeRange* m = desired_mode(t, job, s);
    slot.mode = m ? m->mode : uint32_t(w::Mode::SYNC);
    slot.quorum = m ? m->quorum : 0;
  }
  const uint32_t member = uint32_t(job) * w::MAX_WORKERS + wk;
  const uint32_t bit = wk < 32 ? 1u << wk : 0;
  const uint32_t cur = slot.round, count = slot.count;
  const uint32_t q = slot.quorum == 0 ? cfg.members : std::min(slot.quorum, cfg.members);
  const std::size_t seq_index = std::size_t(s) * w::MAX_WORKERS + wk;
  uint32_t& seq = member_seq_[seq_index];
  uint32_t& seq_epoch = member_epoch_[seq_index];
  const uint32_t refused_mark = ~cfg.epoch;  // protocol.md §4 step 8
  const bool counted = seq_epoch == cfg.epoch && seq == r;
  // r is an older contribution of w's than the one the cell counted (protocol.md §4 step 10).
  const bool behind = seq_epoch == cfg.epoch && seq - r - 1 < w::ASYNC_WINDOW - 1;
  const JobRole* role = nullptr;
  if (!t.roles.empty()) {
    auto it = t.roles.find(job);
    if (it != t.roles.end() && it->second.level != Level::SINGLE) role = &it->second;
  }
  if (role && role->level == Level::LEAF && levels_[s].up_pending && r == levels_[s].up_round)
    return pending_round(c, slot, *role, s, job, wk, r, version, echo, cfg.epoch, nbytes, out);

  // The decision table (hysync/protocol_spec/decision.py, generated into hysync_decision.h).
  namespace f = decision::fact;
  const uint32_t facts =
      (slot.mode == uint32_t(w::Mode::ASYNC) ? f::ASYNC : 0) | (counted ? f::COUNTED : 0) |
      (seq_epoch == refused_mark && seq == r ? f::REFUSED : 0) |
      (seq_epoch == refused_mark && seq == ~r ? f::JOIN_MARKED : 0) | (join ? f::JOIN : 0) |
      (r == cur ? f::OPEN : 0) | (r == cur - 1 && slot.res_valid ? f::PREV : 0) |
      (count == 0 ? f::EMPTY : 0) | (slot.bitmap & bit ? f::HAS_BIT : 0) |
      (count >= q ? f::FULL : 0) | (count + 1 >= q ? f::CLOSES : 0) |
      (chunk != slot.chunk ? f::CHUNK_DIFFERS : 0) | (slot.res_bitmap & bit ? f::RES_HAS_BIT : 0) |
      (behind ? f::BEHIND : 0);
  const decision::Outcome& o = decision::decide(facts);

  switch (o.seq) {
    case decision::SeqOp::NONE: break;
    case decision::SeqOp::RECORD:
      seq = r;
      seq_epoch = cfg.epoch;
      break;
    case decision::SeqOp::REFUSE:  // r answered "not counted": never counted later
      if (role)
        refuse_unless_later(seq_index, r, cfg.epoch);
      else if (!counted && !behind)  // (never over a newer contribution counted)
        seq = r, seq_epoch = refused_mark;
      break;
    case decision::SeqOp::JOIN_MARK:  // a copy of this JOIN must not count in a later round r
      if (!counted) seq = ~r, seq_epoch = refused_mark;
      break;
    case decision::SeqOp::JOIN_SPEND: seq_epoch = 0; break;
  }
  if (o.drop != decision::NO_DROP) drop(c, job, DropReason(o.drop), nbytes);
  static constexpr CounterId MEMBER_COUNTER[] = {NUM_COUNTERS, CONTRIBUTIONS, LATE, DUPLICATES,
                                                 STALE};
  if (o.counter != decision::Counter::NONE)
    c.count(MEMBER_COUNTER[std::size_t(o.counter)], member, nbytes);
  const uint32_t bank = register_bank(s, cur);
  int32_t* bank_lanes = &lanes_[std::size_t(bank) * w::LANES];
  const uint8_t* lanes_in = p + w::HEADER_BYTES;
  switch (o.lanes) {
    case decision::LaneOp::NONE: break;
    case decision::LaneOp::WRITE_OPEN:
      slot.chunk = chunk;
      [[fallthrough]];
    case decision::LaneOp::WRITE:
      for (std::size_t i = 0; i < w::LANES; ++i) bank_lanes[i] = int32_t(load_be32(lanes_in + 4 * i));
      break;
    case decision::LaneOp::ADD:
      // Wrapping int32 adds, as the reference model's int32 numpy array and P4's bit<32>.
      for (std::size_t i = 0; i < w::LANES; ++i)
        bank_lanes[i] = int32_t(uint32_t(bank_lanes[i]) + load_be32(lanes_in + 4 * i));
      break;
  }

  if (role && (o.emit == decision::Emit::CLOSE || o.emit == decision::Emit::ABSORB ||
               o.emit == decision::Emit::CLOSE_AS_IS))
    return level_update(c, slot, *role, o.emit, p, s, job, wk, cfg.group, cur, bank, chunk,
                        count, bit, version, nbytes, out);
  switch (o.emit) {
    case decision::Emit::NONE: return none;
    case decision::Emit::ABSORB:
      slot.count = count + 1;
      slot.bitmap |= bit;
      return none;
    case decision::Emit::CLOSE:
      return close(c, slot, s, job, wk, cfg.group, cur, bank, chunk, count + 1,
                   slot.bitmap | bit, version, nbytes, out);
    case decision::Emit::CLOSE_AS_IS:
      return close(c, slot, s, job, wk, cfg.group, cur, bank, slot.chunk, count, slot.bitmap,
                   version, nbytes, out);
    case decision::Emit::RESEND:
      put_header(out, version, uint8_t(Op::RESULT), uint8_t(w::Flag::RESEND) | echo,
                 slot.res_mode, job, wk, slot.res_count, s, install_tag(slot.epoch),
                 slot.res_quorum, r, slot.res_chunk, slot.res_bitmap);
      put_lanes(register_bank(s, r), out);
      return {Emit::REPLY, 0, w::PACKET_BYTES};
    case decision::Emit::ACK:
      put_header(out, version, uint8_t(Op::ACK), echo, slot.mode, job, wk, 0, s,
                 install_tag(slot.epoch), slot.quorum, r, chunk, 0);
      return {Emit::REPLY, 0, w::HEADER_BYTES};
    case decision::Emit::RESYNC:
      return {Emit::REPLY, 0, resync(slot, s, version, job, wk, echo, o.reason, out)};
  }
  return none;
}

const JobConfig* Pipeline::job_of_slot(CounterShard& c, const Tables& t, uint16_t job,
                                       uint16_t s, uint64_t nbytes) {
  auto job_it = t.jobs.find(job);
  if (job_it == t.jobs.end()) return drop(c, job, DropReason::NO_JOB, nbytes), nullptr;
  const JobConfig& cfg = job_it->second;
  if (s < cfg.slot_base || s >= uint64_t(cfg.slot_base) + cfg.slot_count || s >= num_slots_)
    return drop(c, job, DropReason::SLOT_RANGE, nbytes), nullptr;
  return &cfg;
}

void Pipeline::start_afresh(Slot& slot, uint32_t s, uint32_t epoch) {
  slot.epoch = epoch;
  slot.round = slot.count = slot.bitmap = slot.chunk = 0;
  slot.res_valid = false;
  levels_[s].weight = 0;  // and, at a spine or a leaf, no weight and no sum at the spine
  levels_[s].up_pending = false;
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

std::size_t Pipeline::resync(const Slot& slot, uint32_t s, uint8_t version, uint16_t job,
                             uint8_t wk, uint8_t echo, w::ResyncReason reason,
                             uint8_t* out) const {
  put_header(out, version, uint8_t(Op::RESYNC), echo, slot.mode, job, wk, slot.count, uint16_t(s),
             uint8_t(reason), slot.quorum, slot.round, slot.chunk, slot.bitmap);
  return w::HEADER_BYTES;
}

uint32_t& Pipeline::member_cell(const std::string& name, std::size_t index) {
  if (index >= std::size_t(num_slots_) * w::MAX_WORKERS)
    throw std::out_of_range("member register index " + std::to_string(index) + " is outside 0.." +
                            std::to_string(num_slots_ * w::MAX_WORKERS - 1));
  return name == "member_seq" ? member_seq_[index] : member_epoch_[index];
}

void Pipeline::write_member_register(const std::string& name, std::size_t index,
                                     uint32_t value) {
  if (name != "member_seq" && name != "member_epoch")
    throw std::invalid_argument("register " + name + " is not a member register: write "
                                "member_seq or member_epoch");
  auto lock = exclusive();
  member_cell(name, index) = value;
}

uint32_t Pipeline::read_register(const std::string& name, std::size_t index) {
  auto lock = exclusive();
  if (name == "member_seq" || name == "member_epoch") return member_cell(name, index);
  if (index >= num_slots_)
    throw std::out_of_range("slot " + std::to_string(index) + " is outside 0.." +
                            std::to_string(num_slots_ - 1));
  const Slot& sl = slots_[index];
  const LevelSlot& lv = levels_[index];
  const std::pair<const char*, uint32_t> cells[] = {
      {"slot_epoch", sl.epoch},     {"res_valid", sl.res_valid}, {"round", sl.round},
      {"count", sl.count},          {"bitmap", sl.bitmap},       {"chunk", sl.chunk},
      {"mode", sl.mode},            {"quorum", sl.quorum},       {"res_bitmap", sl.res_bitmap},
      {"res_count", sl.res_count},  {"res_chunk", sl.res_chunk}, {"res_mode", sl.res_mode},
      {"res_quorum", sl.res_quorum}, {"weight", lv.weight},      {"up_pending", lv.up_pending},
      {"up_round", lv.up_round},    {"up_bitmap", lv.up_bitmap}, {"up_count", lv.up_count},
      {"up_chunk", lv.up_chunk},    {"up_tx", lv.up_tx}};
  for (const auto& [cell, value] : cells)
    if (name == cell) return value;
  throw std::invalid_argument("no register " + name + ": name one of the reference model's "
                              "(round, count, member_seq, up_pending, ...)");
}

}  // namespace hysync::dataplane
