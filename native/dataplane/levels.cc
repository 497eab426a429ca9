// The two-level rules (docs/protocol.md §11) of the native pipeline: a spine weighs each
// leaf's uplink by the hosts in it; a leaf sends a closed round up as its contribution, sends
// it again only on a host's retransmission, and relays the spine's verdicts to its hosts.
// Byte for byte what softswitch/pipeline.py does for a job with a role.
#include <cstring>

#include "dataplane/pipeline.h"

namespace hysync::dataplane {

namespace w = wire;
using w::DropReason;
using w::Op;

namespace {
constexpr Verdict none{Emit::NONE, 0, 0};
constexpr uint32_t TX_BITS = w::TX_MASK >> w::TX_SHIFT;
}  // namespace

Verdict Pipeline::level_update(CounterShard& c, Slot& slot, const JobRole& role,
                               decision::Emit emit, const uint8_t* p, uint32_t s, uint16_t job,
                               uint8_t wk, uint32_t group, uint32_t cur, uint32_t bank,
                               uint32_t chunk, uint32_t count, uint32_t bit, uint8_t version,
                               uint64_t nbytes, uint8_t* out) {
  LevelSlot& lv = levels_[s];
  if (role.level == Level::SPINE) {
    // count[s] counts leaves (the quorum is of racks); the RESULT's count is the hosts.
    const uint32_t hosts = p[w::OFF_COUNT];
    if (emit == decision::Emit::ABSORB) {
      slot.count = count + 1;
      slot.bitmap |= bit;
      lv.weight += hosts;
      return none;
    }
    // The weight is the RESULT's count byte: leaves that claim more than 255 hosts between
    // them wrap it, as a P4 bit<8> field does (a two-level job has at most 255).
    const uint32_t weight = lv.weight;
    lv.weight = 0;
    if (emit == decision::Emit::CLOSE)
      return close(c, slot, s, job, wk, group, cur, bank, chunk, (weight + hosts) & 0xFF,
                   slot.bitmap | bit, version, nbytes, out);
    return close(c, slot, s, job, wk, group, cur, bank, slot.chunk, weight & 0xFF, slot.bitmap,
                 version, nbytes, out);
  }
  // While a sum is at the spine the open round absorbs and waits: it closes on a member's
  // first packet after the verdict (the close on a retransmission).
  if (emit == decision::Emit::ABSORB || (emit == decision::Emit::CLOSE && lv.up_pending)) {
    slot.count = count + 1;
    slot.bitmap |= bit;
    return none;
  }
  if (lv.up_pending) return none;  // CLOSE_AS_IS: the same wait
  if (emit == decision::Emit::CLOSE)
    return close_up(c, slot, role, s, job, wk, cur, chunk, count + 1, slot.bitmap | bit,
                    version, nbytes, out);
  return close_up(c, slot, role, s, job, wk, cur, slot.chunk, count, slot.bitmap, version,
                  nbytes, out);
}

// A leaf's close: the sum stays in bank cur & 1 and goes up as the leaf's CONTRIB; there is no
// result to resend until the spine's verdict comes back.
Verdict Pipeline::close_up(CounterShard& c, Slot& slot, const JobRole& role, uint32_t s,
                           uint16_t job, uint8_t wk, uint32_t cur, uint32_t chunk,
                           uint32_t count, uint32_t bitmap, uint8_t version, uint64_t nbytes,
                           uint8_t* out) {
  c.count(CLOSES, uint32_t(job) * w::MAX_WORKERS + wk, nbytes);
  LevelSlot& lv = levels_[s];
  lv.up_pending = true;
  lv.up_round = cur;
  lv.up_bitmap = bitmap;
  lv.up_count = count;
  lv.up_chunk = chunk;
  slot.res_valid = false;
  slot.round = cur + 1;
  slot.count = 0;
  slot.bitmap = 0;
  return uplink(slot, role, s, job, version, false, out);
}

Verdict Pipeline::uplink(const Slot& slot, const JobRole& role, uint32_t s, uint16_t job,
                         uint8_t version, bool retransmit, uint8_t* out) {
  LevelSlot& lv = levels_[s];
  lv.up_tx = (lv.up_tx + 1) & TX_BITS;
  const uint8_t flags = uint8_t(lv.up_tx << w::TX_SHIFT) |
                        (retransmit ? uint8_t(w::Flag::RETRANSMIT) : uint8_t(0));
  put_header(out, version, uint8_t(Op::CONTRIB), flags, slot.mode, job, role.uplink_id,
             lv.up_count, uint16_t(s), 0, slot.quorum, lv.up_round, lv.up_chunk, 0);
  put_lanes(2 * s + (lv.up_round & 1), out);
  return {Emit::UPLINK, job, w::PACKET_BYTES};
}

// A host's packet for the round whose sum is at the spine: from a host in the sum it asks
// again (its result or the uplink was lost), which is the uplink's only retransmission
// (switches have no timers); from any other host it is late.
Verdict Pipeline::pending_round(CounterShard& c, Slot& slot, const JobRole& role, uint32_t s,
                                uint16_t job, uint8_t wk, uint32_t r, uint8_t version,
                                uint8_t echo, uint32_t epoch, uint64_t nbytes, uint8_t* out) {
  if (wk < 32 && levels_[s].up_bitmap >> wk & 1) {
    drop(c, job, DropReason::UPLINK_RESENT, nbytes);
    return uplink(slot, role, s, job, version, true, out);
  }
  refuse_unless_later(std::size_t(s) * w::MAX_WORKERS + wk, r, epoch);
  drop(c, job, DropReason::STALE, nbytes);
  c.count(STALE, uint32_t(job) * w::MAX_WORKERS + wk, nbytes);
  return {Emit::REPLY, 0,
          resync(slot, s, version, job, wk, echo, w::ResyncReason::STALE_ROUND, out)};
}

// The refusal mark at a leaf or a spine: never over a cell that says the member was counted
// in `r` or a later round (a late copy of an older contribution must not erase that a newer
// one counted: its owner, asking about it, would carry what was summed).
void Pipeline::refuse_unless_later(std::size_t seq_index, uint32_t r, uint32_t epoch) {
  if (member_epoch_[seq_index] != epoch || serial_after(r, member_seq_[seq_index])) {
    member_seq_[seq_index] = r;
    member_epoch_[seq_index] = ~epoch;
  }
}

// The spine did not count the leaf's sum of round `r`: each of its hosts reads "not counted
// in r" from now on, over the leaf's own "counted", unless its cell is about a later round.
// (The P4 programs replicate the verdict to the recirculation port, one copy per host, to
// write one cell per packet; the loop is that replication.)
void Pipeline::refuse_hosts(uint32_t s, uint32_t hosts, uint32_t r, uint32_t epoch) {
  const uint32_t mark = ~epoch;
  const std::size_t base = std::size_t(s) * w::MAX_WORKERS;
  for (; hosts; hosts &= hosts - 1) {
    const std::size_t i = base + __builtin_ctz(hosts);
    if ((member_epoch_[i] == epoch || member_epoch_[i] == mark) && serial_after(member_seq_[i], r))
      continue;
    member_seq_[i] = r;
    member_epoch_[i] = mark;
  }
}

// A RESULT or RESYNC that reached a leaf of its job: the spine's answer to an uplink, or a
// round the spine closed. Admitted from the uplink's spine address only.
Verdict Pipeline::verdict(CounterShard& c, const Tables& t, const JobRole& role,
                          const uint8_t* p, std::size_t size, uint32_t src_ip, uint64_t nbytes,
                          uint8_t* out) {
  const uint8_t op = p[w::OFF_OP];
  const uint16_t job = load_be16(p + w::OFF_JOB_ID);
  const uint16_t s = load_be16(p + w::OFF_SLOT);
  if (src_ip != role.spine_addr) return drop(c, job, DropReason::NOT_MEMBER, nbytes), none;
  if (op == uint8_t(Op::RESULT) && size < w::PACKET_BYTES)
    return drop(c, job, DropReason::MALFORMED, nbytes), none;
  if (p[w::OFF_VERSION] != w::VERSION) return drop(c, job, DropReason::BAD_VERSION, nbytes), none;
  if (size != (op == uint8_t(Op::RESULT) ? w::PACKET_BYTES : w::HEADER_BYTES))
    return drop(c, job, DropReason::BAD_LENGTH, nbytes), none;
  const JobConfig* job_cfg = job_of_slot(c, t, job, s, nbytes);
  if (job_cfg == nullptr) return none;
  const JobConfig& cfg = *job_cfg;
  Slot& slot = slots_[s];
  SlotLock lock(slot);
  if (slot.epoch != cfg.epoch) start_afresh(slot, s, cfg.epoch);
  if (op == uint8_t(Op::RESULT)) {
    // Every switch of a job runs the same install: a result of another one (a spine
    // restarted, the job added again) belongs to no sum here.
    if (p[w::OFF_REASON] != install_tag(cfg.epoch))
      return drop(c, job, DropReason::STALE, nbytes), none;
    return spine_result(c, slot, role, p, cfg.epoch, cfg.group, nbytes, out);
  }
  return spine_resync(c, slot, p, cfg.epoch, cfg.group, nbytes, out);
}

Verdict Pipeline::spine_result(CounterShard& c, Slot& slot, const JobRole& role,
                               const uint8_t* p, uint32_t epoch, uint32_t group,
                               uint64_t nbytes, uint8_t* out) {
  const w::Header h = w::load_header(p);
  const uint32_t s = h.slot, r = h.round, cur = slot.round;
  LevelSlot& lv = levels_[s];
  uint32_t hosts = 0;
  if (lv.up_pending && r == lv.up_round) {
    // The answer to the sum: the hosts' bits go down only with the leaf's own.
    lv.up_pending = false;
    hosts = lv.up_bitmap;
    if (!(role.uplink_id < 32 && h.bitmap >> role.uplink_id & 1)) {
      refuse_hosts(s, hosts, r, epoch);
      hosts = 0;
    }
  } else if (!serial_after(cur, r)) {
    // A round the spine closed without this rack: what the leaf had open can no longer
    // reach the spine. A sum pending for an earlier round stays pending.
    refuse_hosts(s, slot.bitmap, cur, epoch);
    slot.round = r + 1;
    slot.count = slot.bitmap = 0;
  } else {
    return drop(c, h.job_id, DropReason::DUPLICATE, nbytes), none;
  }
  const uint8_t* lanes = p + w::HEADER_BYTES;
  // Only the last round's result is kept for RESENDs: a verdict that the spine's multicast
  // delivered behind a later round's is relayed, not stored.
  if (r == slot.round - 1) {
    int32_t* bank = &lanes_[std::size_t(2 * s + (r & 1)) * w::LANES];
    for (std::size_t i = 0; i < w::LANES; ++i) bank[i] = int32_t(load_be32(lanes + 4 * i));
    slot.res_bitmap = hosts;
    slot.res_count = h.count;
    slot.res_chunk = h.chunk;
    slot.res_mode = h.mode;
    slot.res_quorum = h.quorum;
    slot.res_valid = true;
  }
  put_header(out, h.version, uint8_t(Op::RESULT), 0, h.mode, h.job_id, h.worker_id, h.count,
             h.slot, install_tag(epoch), h.quorum, r, h.chunk, hosts);
  std::memcpy(out + w::HEADER_BYTES, lanes, w::PACKET_BYTES - w::HEADER_BYTES);
  return {Emit::MULTICAST, group, w::PACKET_BYTES};
}

// The spine's RESYNC answering the latest uplink (the echo ties them): the sum is counted
// (STALE_COUNTED: its result is gone) or not, then relayed to its hosts.
Verdict Pipeline::spine_resync(CounterShard& c, Slot& slot, const uint8_t* p, uint32_t epoch,
                               uint32_t group, uint64_t nbytes, uint8_t* out) {
  const w::Header h = w::load_header(p);
  const uint32_t s = h.slot, r = h.round;
  LevelSlot& lv = levels_[s];
  if (!lv.up_pending || (h.flags & w::TX_MASK) != (lv.up_tx << w::TX_SHIFT))
    return drop(c, h.job_id, DropReason::STALE, nbytes), none;
  lv.up_pending = false;
  Verdict v = none;
  if (h.reason != uint8_t(w::ResyncReason::STALE_COUNTED)) {
    refuse_hosts(s, lv.up_bitmap, lv.up_round, epoch);
    // Which flight it settles: a STALE_ROUND names it by the sum's chunk (the spine's round
    // may be ahead of it); a CHUNK_MISMATCH answers the spine's open round, the sum's, and
    // carries the chunk that round aggregates, which the hosts contribute instead (§9).
    const bool mismatch = h.reason == uint8_t(w::ResyncReason::CHUNK_MISMATCH);
    put_header(out, h.version, uint8_t(Op::RESYNC), uint8_t(w::Flag::RELAYED), h.mode, h.job_id,
               h.worker_id, 0, h.slot, h.reason, h.quorum, r, mismatch ? h.chunk : lv.up_chunk,
               lv.up_bitmap);
    v = {Emit::MULTICAST_BITMAP, group, w::HEADER_BYTES};
  }
  if (serial_after(r, slot.round)) {
    // Forward: a RESYNC delayed behind later results must not take the leaf back to a round
    // its hosts are past.
    refuse_hosts(s, slot.bitmap, slot.round, epoch);
    slot.round = r;
    slot.count = slot.bitmap = 0;
    slot.res_valid = false;
  } else if (h.reason == uint8_t(w::ResyncReason::CHUNK_MISMATCH) && r == lv.up_round &&
             slot.round == r + 1) {
    // Back by one: the spine's open round r waits on this rack with another chunk, and no
    // result of r exists anywhere, so r opens again here (nothing in it) for the chunk the
    // hosts were told; what the leaf held open at r + 1 can go up no more.
    refuse_hosts(s, slot.bitmap, slot.round, epoch);
    slot.round = r;
    slot.count = slot.bitmap = 0;
    slot.res_valid = false;
  }
  return v;
}

}  // namespace hysync::dataplane
