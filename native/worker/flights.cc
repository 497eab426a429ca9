// Flights and their timers (flights.h).
#include "worker/flights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "worker/wire_names.h"

namespace hysync::worker {

namespace {

constexpr uint8_t TX_NUMBERS = wire::TX_MASK >> wire::TX_SHIFT;  // 31: numbers wrap mod 32
constexpr uint8_t STALE_COUNTED = uint8_t(wire::ResyncReason::STALE_COUNTED);

}  // namespace

int32_t Flight::lane(std::size_t j) const { return int32_t(load_be32(&data[H + 4 * j])); }

Flights::Flights(const EngineConfig& config, const Faults& faults, const Quantizer& quantizer,
                 Backend& io, std::vector<Slot>& slots, Keys& keys, Rounds& rounds,
                 Results& results, EngineStats& stats, const std::unique_ptr<Call>& call)
    : cfg_(config),
      faults_(faults),
      quantizer_(quantizer),
      io_(io),
      slots_(slots),
      keys_(keys),
      rounds_(rounds),
      results_(results),
      stats_(stats),
      call_(call),
      w_(uint32_t(slots.size())),
      waits_since_(slots.size(), 0.0),
      last_rx_(io.now()) {}

void Flights::start_call(double now) {
  progress_at_ = now;
  ++calls_;
  woke_late_ = 0;  // timers that fell due between calls were not waited for
  std::fill(waits_since_.begin(), waits_since_.end(), now);  // the call's chunks wait from now
  for (uint32_t i = 0; i < w_; ++i) order_queue(i);
  // A slot held by a parked packet: the call hurries it before the timers that fell due
  // between calls run, so the call's chunks there wait one RTO for its answer (hold_queue).
  // The parked packet's own timer (its next retransmission, every rto_max) falls due between
  // calls as often as not; run first, it carried the call's chunks there at once (expire),
  // and a call whose every slot was held ended at its start: its member ran a call ahead of
  // the others, and behind a slow switch they met out of step, rounds of one key's chunk
  // displacing another key's, for the rest of the job (seed 9061714).
  if (!faults_.carry_held_at_start)
    for (uint32_t i = 0; i < w_; ++i)
      if (slots_[i].flight && slots_[i].flight->parked) hold_queue(i, now);
  // Then the timers that fell due between calls: a call whose every slot is held by a parked
  // packet may end by carrying and never wait for a reply, so a STALE reply's grace period
  // would otherwise never end (the worker falls silent).
  expire(now);
  for (uint32_t i = 0; i < w_; ++i) {
    if (!slots_[i].flight)
      send_next(i, now);
    else if (slots_[i].flight->parked && faults_.carry_held_at_start)
      hold_queue(i, now);
  }
}

// Partial: slot i's chunks of the key go out least recently closed first (Key::closed: the
// order in which their rounds' results were applied). A call whose slot is held by a parked
// packet carries what it has not sent there after one RTO (expire), so behind a switch slower
// than the workers' compute a call counts one chunk a slot; in the fixed order it is the same
// chunk every call, and the chunks behind it never reach a round (their gradient piles up in
// the residual). Least recently closed first, a chunk that reached no round goes first in every
// call until one closes with it (§9 "Sync / partial sending", bounded staleness). The order is
// read from results, which every member applies (RULE A), so members send alike: an order drawn
// from each member's own contributions departs after an abort or a restart, members open rounds
// of different chunks, and a chunk can lose its turn at every call. Other modes keep the fixed
// order, which needs no slot to be told apart: in sync every call sends every chunk, and members
// pair on it.
void Flights::order_queue(uint32_t i) {
  if (!call_ || faults_.fixed_order || slots_[i].mode != PARTIAL) return;
  auto& queue = call_->queues[i];
  if (queue.size() < 2) return;
  const auto& closed = keys_.at(call_->key).closed;
  std::stable_sort(queue.begin(), queue.end(), [&](int64_t a, int64_t b) {
    return closed[std::size_t(a)] < closed[std::size_t(b)];
  });
}

// Partial: a round of slot i closed with `chunk` (its result applied) while the call's own
// copy of it still waits in the slot's queue - the round counted a packet of an earlier call,
// parked into this one, or the other members' contributions. That chunk is now the slot's most
// recently closed, so it goes last, as order_queue would put it; the order drawn at the call's
// start would send it next, open the slot's next round with it and displace the chunk the
// others, who read the same results, send there (CHUNK_MISMATCH; partial carries the displaced
// chunk), and the member a call ahead displaces that chunk at every call (seed 9024099: a
// member's parked chunk 2 closed round 3 and its call, started before, sent chunk 2 again at
// round 4 while the others sent chunk 8, which reached no round again).
// Then the call's chunks that a round of another chunk of the key displaced, if that round
// has closed now, are offered again (reoffer_displaced).
void Flights::round_closed(uint32_t i, uint32_t chunk, uint32_t rnd, double now) {
  if (!call_ || slots_[i].mode != PARTIAL) return;
  const Key& reg = keys_.at(call_->key);
  const int64_t local = reg.local_of(chunk);
  const bool of_key = local >= 0 && local < reg.chunks;
  // A re-offer of the chunk that just closed would open a round the others are past.
  if (of_key && call_->reoffer[std::size_t(local)]) drop_reoffer(i, local);
  if (!call_->displaced[i].empty()) reoffer_displaced(i, rnd, now);
  if (faults_.order_at_start || faults_.fixed_order) return;
  // (cheap tests first: a result is of the chunk just sent far more often than of one queued)
  if (!of_key || call_->prepared[std::size_t(local)] ||
      call_->outcome[std::size_t(local)] != Outcome::PENDING)
    return;
  auto& queue = call_->queues[i];
  const auto at = std::find(queue.begin(), queue.end(), local);
  if (at == queue.end()) return;
  queue.erase(at);
  queue.push_back(local);
}

// Partial: round `rnd` of slot i closed. A chunk of the call that a round of another chunk of
// the key displaced (CHUNK_MISMATCH: this member joined that round and carried its own, §9)
// is offered again once that round is closed: queued at its place in the order least recently
// closed first, it goes out as a residual-only contribution of its carried amount (send_next),
// at the slot's next round. The members that heard the same results send the same chunk there
// (no round has closed with it since), so it meets them. Carried instead, to the key's next
// call, it met there the round the other member opened with its last chunk, half a call ahead,
// and was displaced again at every call (seed 9019721: two members on one slot of a key's
// chunks 0, 1 and 2; chunk 1 reached no round). The amount is the residual's, taken out of it
// by the packet and given back if no round counts it (take_residual, return_residual): sent
// once, or carried.
void Flights::reoffer_displaced(uint32_t i, uint32_t rnd, double now) {
  auto& displaced = call_->displaced[i];
  bool queued = false;
  for (auto it = displaced.begin(); it != displaced.end();) {
    if (uint32_t(rnd - it->round) >= HALF32) {  // its round is still ahead
      ++it;
      continue;
    }
    queue_reoffer(i, it->local);
    queued = true;
    it = displaced.erase(it);
  }
  if (queued && !slots_[i].flight) send_next(i, now);
}

// Queue a displaced chunk of the call at its place in slot i's order (least recently closed
// first; chunks no round has closed with in their fixed order), marked as a re-offer.
void Flights::queue_reoffer(uint32_t i, int64_t local) {
  auto& queue = call_->queues[i];
  const auto& closed = keys_.at(call_->key).closed;
  const auto key = [&](int64_t l) { return std::make_pair(closed[std::size_t(l)], l); };
  const auto at = std::find_if(queue.begin(), queue.end(),
                               [&](int64_t l) { return key(l) > key(local); });
  queue.insert(at, local);
  call_->reoffer[std::size_t(local)] = 1;
}

void Flights::drop_reoffer(uint32_t i, int64_t local) {
  auto& queue = call_->queues[i];
  const auto at = std::find(queue.begin(), queue.end(), local);
  if (at != queue.end()) queue.erase(at);
  call_->reoffer[std::size_t(local)] = 0;
}

// ------------------------------------------------------------------ sending
void Flights::send_next(uint32_t i, double now) {
  if (!call_) return;
  auto& queue = call_->queues[i];
  while (!queue.empty()) {
    int64_t local = queue.front();
    queue.pop_front();
    if (call_->reoffer[std::size_t(local)]) {  // a displaced chunk offered again (round_closed)
      call_->reoffer[std::size_t(local)] = 0;
      if (slots_[i].mode != PARTIAL || !slots_[i].known) continue;  // it waits as residual
      const uint32_t chunk = keys_.at(call_->key).chunk_id(local);
      send_extra(i, Kind::RESIDUAL, call_->key, chunk, slots_[i].next_round, now, false);
      slots_[i].flight->reoffer = true;
      return;
    }
    if (call_->outcome[std::size_t(local)] == Outcome::PENDING) {
      if (hold_past_sync_copy(i, now)) {
        queue.push_front(local);
        return;
      }
      send_own(i, local, nullptr, now);
      return;
    }
  }
  send_chased(i, now);
}

// Async: my contribution goes out under the slot's next sequence number, and the switch
// refuses a late copy of an earlier packet of mine only by the number in my member cell (§4
// step 10): a sync-style packet's round field is a number of another count, never behind a
// sequence number, and is refused (ACKed) only while the cell holds that round field itself.
// A packet sent more than once (a call's hurry of a parked packet, a timer's retransmission)
// is settled by the answer to one of its copies, which need not be the last: a later copy
// still on its way that reaches the slot behind the new contribution, on an uplink out of
// order, is counted a second time (seed 9081944: a call's start hurried a parked packet, the
// slot just turned async unheard, the async RESULT of the copy before launched the next chunk
// at once, and the hurried copy came in behind it). So the slot's contribution under a new
// sequence number waits until the last copy of the slot's latest packet, if that was
// sync-style and sent more than once, is one RTO old: by then it has reached the switch, or
// is lost. A packet sent once was answered itself; the copies of a packet before it left one
// round trip of the latest earlier at least (holding for those too moved seed 9068240's
// schedule into a cross-slot wait no rule allows). A JOIN is never counted in async; a probe
// (no round known) meets a new state, whose member cell holds nothing of mine anyway.
// The RTO of the path (Rto::path), learned from answers the switch sent as my packet
// arrived: the copy's way to the switch is all the hold waits for, and the RTO that times
// packets out is learned from answers that also waited in open rounds for the other members
// (seed 9125740: partial rounds of quorum 5 before a swap storm put the srtt at 64-94 ms and
// its variation at 91-109 ms, the RTO at 0.43-0.5 s, none of it backed off, on a path whose
// round trip is ~2 ms; five slots of two members turned async held their contributions
// 0.29-0.49 s, worker 4's call stalled half a second, and on the schedule that left, in
// partial after the storm, worker 2's calls each got one chunk through on slots 16 and 20,
// and its chunks 0 and 12, last in the order there, reached no round in its last 3 calls).
bool Flights::hold_past_sync_copy(uint32_t i, double now) {
  Slot& s = slots_[i];
  if (faults_.launch_past_sync_copy || s.mode != ASYNC || !s.known || s.sync_sent_at < 0)
    return false;
  const double wait =
      faults_.hold_past_copy_by_rto ? rto_.value() : std::min(rto_.value(), rto_.path());
  const double at = s.sync_sent_at + wait;
  if (now >= at) return false;
  s.held_gen = ++gen_;
  timers_.push({at, s.held_gen, i});
  return true;
}

// The slot's queue is empty: send a chunk a sync round of another chunk displaced (retarget)
// again, as residual at the slot's next round, until it reaches a round of its own. Without
// this, members whose calls pair one chunk (or one key) apart on a slot - one ahead after a
// partial or async phase, then a straggler in sync - displace each other's first chunk there
// at every call, and that chunk's gradient never reaches a round (docs/protocol.md §9,
// "Displaced chunks"). Sync only: a partial round closes without me, and an async one needs no
// partner; the chunk waits in the list meanwhile, its value in the residual.
void Flights::send_chased(uint32_t i, double now) {
  auto& chased = slots_[i].chased;
  if (chased.empty() || !slots_[i].known || slots_[i].mode != SYNC || faults_.no_chase) return;
  const uint32_t chunk = chased.front();
  chased.pop_front();
  const int k = keys_.owner(chunk);
  const bool gone = k < 0 || !keys_.at(k).alive;
  // Sent again as this call's own chunk: a round took it, or will.
  const bool own = !gone && call_ && k == call_->key &&
                   call_->outcome[std::size_t(keys_.at(k).local_of(chunk))] != Outcome::CARRIED;
  if (gone || own) return send_chased(i, now);
  send_extra(i, Kind::RESIDUAL, k, chunk, slots_[i].next_round, now, false);
  slots_[i].flight->chase = true;
}

// A sync round of another chunk displaced slot i's flight of `chunk`: remember to send it again.
void Flights::chase(uint32_t i, uint32_t chunk) {
  auto& chased = slots_[i].chased;
  if (std::find(chased.begin(), chased.end(), chunk) == chased.end()) chased.push_back(chunk);
}

void Flights::send_own(uint32_t i, int64_t local, const uint32_t* rnd, double now) {
  Call& c = *call_;
  const Key& reg = keys_.at(c.key);
  auto f = new_flight();
  f->kind = Kind::OWN;
  f->key = c.key;
  f->local = local;
  f->chunk = reg.chunk_id(local);
  int32_t fixed[LANES];
  keys_.prepare_chunk(c, local, fixed, f->err.data());
  for (std::size_t j = 0; j < LANES; ++j) store_be32(&f->data[H + 4 * j], uint32_t(fixed[j]));
  slots_[i].flight = std::move(f);
  ++inflight_;
  launch(i, rnd, now);
}

// A residual-only (or, with no key, zero) contribution for `chunk` at round `rnd`.
void Flights::send_extra(uint32_t i, Kind kind, int k, uint32_t chunk, uint32_t rnd, double now,
                        bool join) {
  auto f = new_flight();
  f->kind = kind;
  f->key = k;
  f->chunk = chunk;
  f->join = join;
  if (k >= 0) {
    f->local = keys_.at(k).local_of(chunk);
    keys_.take_residual(k, f->local, f->amount.data(), call_.get());
    f->has_amount = true;
    int32_t fixed[LANES];
    QuantStats unused;
    quantizer_.quantize_lanes(f->amount.data(), fixed, f->err.data(), LANES, unused);
    for (std::size_t j = 0; j < LANES; ++j) store_be32(&f->data[H + 4 * j], uint32_t(fixed[j]));
    ++stats_.residual_contribs;
  } else {
    std::fill(f->data.begin() + H, f->data.end(), uint8_t(0));  // (a reused flight's bytes)
    ++stats_.null_contribs;
  }
  slots_[i].flight = std::move(f);
  ++inflight_;
  launch(i, &rnd, now);
}

// The call made no progress for join_after: offer every idle slot (nothing in flight, nothing
// left to send there in this call) a JOIN - a residual-only contribution for the key's last chunk
// on that slot, which the switch counts only into an open round that lacks me. Such a round is
// the other half of a cross-slot deadlock after an async -> sync swap (§9): its members wait
// for me on this slot, where an async round already counted my chunk, while I wait for them on
// another slot. A round with another chunk answers CHUNK_MISMATCH (retarget joins that chunk),
// a slot with no round open answers NOT_JOINED (the residual stays mine).
void Flights::join_idle_slots(double now) {
  if (!call_ || now < std::max(progress_at_, joined_at_) + cfg_.join_after) return;
  joined_at_ = now;
  for (uint32_t i = 0; i < w_; ++i)
    if (!slots_[i].flight && call_->queues[i].empty()) offer_join(i, now);
}

// A JOIN for idle slot i at its next_round: the residual of the key's last chunk on that slot
// (the key's chunks on slot i are start, start + W, ...), or zeros if the key has none there.
void Flights::offer_join(uint32_t i, double now, bool at_once) {
  const Key& reg = keys_.at(call_->key);
  const int64_t start = reg.first_local_on(i, w_);
  const int64_t last = start < reg.chunks ? start + (reg.chunks - 1 - start) / w_ * w_ : start;
  const uint32_t chunk = reg.chunk_id(last);
  const bool owned = last < reg.chunks;
  send_extra(i, owned ? Kind::RESIDUAL : Kind::NULLS, owned ? call_->key : -1, chunk,
             slots_[i].next_round, now, true);
  if (slots_[i].flight) slots_[i].flight->join_at_once = at_once;
  ++stats_.joins;
}

// First transmission of the slot's flight at round *rnd (null: the slot's next round or seq).
void Flights::launch(uint32_t i, const uint32_t* rnd, double now) {
  Flight& f = *slots_[i].flight;
  f.probe = !slots_[i].known;
  if (rnd == nullptr && (f.probe || slots_[i].mode == ASYNC)) {
    f.round = next_seq(i);
    f.async_style = true;
  } else {
    f.round = rnd == nullptr ? slots_[i].next_round : *rnd;
    f.async_style = false;
  }
  Header h;  // flags: transmit() writes them, per transmission
  h.version = uint8_t(wire::VERSION);
  h.op = uint8_t(wire::Op::CONTRIB);
  h.job_id = uint16_t(cfg_.job_id);
  h.worker_id = uint8_t(cfg_.worker_id);
  h.slot = wire_slot(cfg_, i);
  h.round = f.round;
  h.chunk = f.chunk;
  wire::store_header(f.data.data(), h);
  f.floor_known = slots_[i].known;
  f.floor = slots_[i].next_round;
  f.tries = 0;
  f.stale = false;
  f.closed = false;
  f.closed_by_my_other = false;
  f.at_forgotten_round = !f.async_style && slots_[i].forgot &&
                         slots_[i].forgot_round == f.round && slots_[i].forgot_chunk != f.chunk;
  f.launched = now;
  f.backoff = rto_.value();
  // Partial: look early (stall_after) for the switch holding it in an open round (holdable).
  f.early_look = holdable(i) && cfg_.stall_after < rto_.value();
  if (f.early_look) f.backoff = cfg_.stall_after;
  transmit(i, now, false);
  f.backoff = rto_.value();
}

void Flights::transmit(uint32_t i, double now, bool retransmit, bool timeout) {
  Flight& f = *slots_[i].flight;
  slots_[i].tx_number = (slots_[i].tx_number + 1) & TX_NUMBERS;
  f.tx = slots_[i].tx_number;
  f.data[wire::OFF_FLAGS] = uint8_t((retransmit ? uint8_t(wire::Flag::RETRANSMIT) : 0) |
                                    (f.join ? uint8_t(wire::Flag::JOIN) : 0) |
                                    f.tx << wire::TX_SHIFT);
  // A timeout's retransmission says a packet may be lost; a parked packet sent again without
  // one (a call's hurry, the copy at parking) is the protocol asking, counted apart.
  if (retransmit) ++(timeout ? stats_.retransmits : stats_.resent);
  if (retransmit && timeout) {
    f.backoff = std::min(2.0 * f.backoff, cfg_.rto_max);
    rto_.back_off(now);  // the timer too
  }
  ++f.tries;
  f.sent_at = now;
  // The copies a contribution under a new sequence number waits for (hold_past_sync_copy):
  // the latest packet's, if it was sent more than once and sync-style (a JOIN's aside).
  if (!f.join) slots_[i].sync_sent_at = !retransmit ? -1 : f.async_style ? -1 : now;
  f.sent_seq = ++sent_seq_;
  if (unanswered_since_ <= last_rx_) unanswered_since_ = now;
  io_.send(f.data.data(), P);
  f.gen = ++gen_;
  timers_.push({now + f.backoff, f.gen, i});
}

uint32_t Flights::next_seq(uint32_t i) {
  uint32_t seq = slots_[i].seq + 1;
  if (seq == 0) seq = 1;
  slots_[i].seq = seq;
  return seq;
}

// ------------------------------------------------------------------ timers
void Flights::expire(double now) {
  while (!timers_.empty() && timers_.top().at <= now) {
    const Timer t = timers_.top();
    timers_.pop();
    Flight* f = slots_[t.slot].flight.get();
    if (!f && t.gen == slots_[t.slot].held_gen) {  // a contribution held (hold_past_sync_copy)
      slots_[t.slot].held_gen = 0;
      send_next(t.slot, now);
      continue;
    }
    if (!f || f->gen != t.gen) continue;
    const uint32_t i = t.slot;
    if (f->stale) {
      decide_stale(i, now);
      continue;
    }
    // Partial, stall_after after the first transmission: if the switch has answered since it
    // left, the switch is at work and silent about this one, so it holds it in an open round
    // that waits for the others' next call: park it now, not an RTO later (the RTO, learned
    // from replies that waited for such rounds, runs to tens of milliseconds). No answer
    // since: nothing is learned; its timer runs out the RTO. Never a retransmission here.
    if (f->early_look) {
      f->early_look = false;
      const bool held = holdable(i) && last_rx_ > f->sent_at;
      if (held) park(i);  // its timer: rto_max (park)
      timers_.push({held ? now + f->backoff : f->sent_at + rto_.value(), f->gen, i, t.extended});
      continue;
    }
    // A timer that fires late because this process waited for a core after its wait for the
    // timer ended (woke_late_; the socket was read first, read_before_timeouts): the switch
    // and the other workers share the machine and wait alike, so the reply may be as late.
    // It gets that long again, once, before the packet counts as lost.
    const double late = std::min(now - t.at, woke_late_);
    if (!t.extended && late >= cfg_.rto_min) {
      timers_.push({now + std::min(late, cfg_.rto_max), t.gen, t.slot, true});
      continue;
    }
    // A first transmission's timer armed under an RTO the samples since have outgrown (the
    // window of a call goes out at once, before its first answers teach the call's RTT)
    // runs to the RTO in force, as TCP's one timer does, re-armed at every answer.
    if (f->tries == 1 && f->sent_at + rto_.value() > now) {
      timers_.push({f->sent_at + rto_.value(), t.gen, t.slot, t.extended});
      continue;
    }
    // The switch has answered nothing sent after this packet (silent_flight), so the whole
    // window waits on one slow process (a member that has not contributed yet, the switch
    // waiting for a core), which retransmitting every packet only adds to. Once it has waited
    // longer than the job's recent silences (silence_timeout), one packet per that period
    // probes; the others wait their next back-off (a lost window still goes out, later).
    // Not in partial mode, where silence is the switch's answer and retransmissions lead to
    // parking (stall_after), nor before a slot's mode is known.
    if (silent_flight(i)) {
      const double silence = rto_.silence_timeout(now);
      if (f->sent_at + silence > now) {
        timers_.push({f->sent_at + silence, t.gen, t.slot, t.extended});
        continue;
      }
      // One probe per period, tested as the timers are armed, probed_at_ + silence: a
      // packet whose own probe set probed_at_ falls due exactly one period later, and the
      // difference now - probed_at_ can round below the period and defer it by rto_max
      // (seed 9045913: behind a switch 0.96 s slow a first contact's probe was lost; sent
      // again 1.9 s late, it met its packet deadline, and every member's call failed with it).
      const bool too_soon = faults_.probe_period_by_difference ? now - probed_at_ < silence
                                                               : now < probed_at_ + silence;
      if (too_soon) {
        f->backoff = std::min(2.0 * f->backoff, cfg_.rto_max);
        timers_.push({now + f->backoff, t.gen, t.slot, t.extended});
        continue;
      }
      probed_at_ = now;
      // The probe goes to the silent packet that has waited longest. Timers that wait their
      // turn back off to rto_max, the probes' own period: the same slot's timer would win
      // every probe and a lost packet on another slot would never go out again (seen: a
      // sync round waiting for ever on a member whose contribution was lost).
      const uint32_t j = longest_silent(i);
      if (j != i) {
        f->backoff = std::min(2.0 * f->backoff, cfg_.rto_max);
        timers_.push({now + f->backoff, t.gen, t.slot, t.extended});
        transmit(j, now, true);
        continue;
      }
    }
    // A call that found this slot held by a parked packet gave its answer one RTO (hurry);
    // unanswered, the call's chunks here are carried now.
    if (f->parked && slots_[i].mode == PARTIAL) carry_queue(i);
    // Partial: silence until the first timeout is the switch holding the packet in an open
    // round (or a loss, which the retransmission below covers): a second timeout would only
    // meet the same silence (the switch drops the duplicate without a word).
    // Parking is that answer, not a sign of a short RTO: the timer does not back off for it,
    // once an RTT sample has taught the RTO. Before any, the RTO is the initial value as
    // timeouts backed it off, and the silence may be a round trip longer than it: the park's
    // copy and every answer after it are retransmissions (Karn: no sample), so nothing else
    // would correct it, and each call's packets would time out and park before their answers
    // came (seed 9086527: behind a switch 0.33 s slow, two members' RTO stayed at 0.32 s and
    // a chunk was carried through three calls). There the RTO backs off (at most once per RTO),
    // unless the switch answered since the packet left: then the silence was a round held
    // open for others, not a round trip longer than the RTO (the early park's reading). Backed
    // off for that, the RTO let the next answers wait in held rounds, and the first sample, one
    // such wait, pinned it at rto_max for the rest of the job (seed 9110370: eight members
    // in rounds needing all, one member's RTO doubled by a held round while the switch answered
    // its other slots within 4 ms; each of its calls then waited rto_max on its held slots).
    const bool heard_since = last_rx_ > f->sent_at && !faults_.unlearned_park_backs_off_heard;
    if (holdable(i) && now - f->launched >= cfg_.stall_after) {
      park(i);
      if (rto_.srtt() < 0 && !heard_since && !faults_.park_keeps_unlearned_rto)
        rto_.back_off(now);
      transmit(i, now, true, false);
      continue;
    }
    transmit(i, now, true);
  }
}

// Partial: slot i's packet is a contribution of mine to what is, as far as I know, the slot's
// open round, and not parked: the switch may hold it there without a word.
bool Flights::holdable(uint32_t i) const {
  const Flight* f = slots_[i].flight.get();
  return f && !f->parked && !f->async_style && f->kind != Kind::NULLS &&
         slots_[i].mode == PARTIAL &&
         slots_[i].known && !f->closed && slots_[i].next_round == f->round;
}

// Slot i's packet waits on a switch that has answered nothing sent after it (sync or async;
// not parked, not in a STALE reply's grace period): the job waits on one slow process. Replies
// may still come in, answers to packets sent before it, as the job's rounds run out. A lost
// packet's timeout meets answers to later packets, as RACK (RFC 8985) tells a loss.
bool Flights::silent_flight(uint32_t i) const {
  const Flight* f = slots_[i].flight.get();
  return f && (slots_[i].mode == SYNC || slots_[i].mode == ASYNC) && !f->parked && !f->stale &&
         answered_seq_ < f->sent_seq;
}

// Of the silent packets, the one sent longest ago (slot i's if none is older).
uint32_t Flights::longest_silent(uint32_t i) const {
  uint32_t best = i;
  for (uint32_t j = 0; j < w_; ++j)
    if (j != i && silent_flight(j) &&
        slots_[j].flight->sent_at < slots_[best].flight->sent_at)
      best = j;
  return best;
}

// Partial mode: the flight met only silence (stall_after while the switch answered others, or
// until its first timeout) while its round is, as far as this worker knows, the slot's open
// round. The switch is silent about a contribution it holds in an open round, so it is most
// likely counted in a round that waits for the others' next call. The
// call settles it as included and carries its remaining chunks on this slot, so that no call of
// mine waits for another worker's next call (across slots, that could wait forever). The packet
// stays in flight until the switch says for certain; if it was not counted, its amount goes
// back into the residual (done()).
void Flights::park(uint32_t i) {
  Flight& f = *slots_[i].flight;
  f.parked = true;
  // The retransmission at parking covers a loss; until an answer (or a call's hurry), the
  // packet waits in an open round, where each retransmission meets silence again.
  f.backoff = cfg_.rto_max;
  ++stats_.parked;
  if (f.kind == Kind::OWN && call_ && f.key == call_->key &&
      call_->outcome[std::size_t(f.local)] == Outcome::PENDING) {
    for (std::size_t j = 0; j < LANES; ++j) f.amount[j] = quantizer_.own_value(f.lane(j));
    f.has_amount = true;
    keys_.settle(*call_, f.local, Outcome::INCLUDED, &f);
    --call_->remaining;
  }
  carry_queue(i);
}

// A call starts while a parked packet holds slot i: retransmit it at once (its answer settles it
// and reports the slot's mode). The call's chunks on the slot wait for that answer for one RTO
// (the packet's timer), then are carried, in partial mode only (expire): in sync every round
// needs every member, so a slot left idle for a call deadlocks the job. Carrying at once would
// let a worker whose every slot is parked, behind a slow switch or slow members, run call after
// call with no round applied, its gradients piling up in its residual.
void Flights::hold_queue(uint32_t i, double now) {
  hurry(i, now);
}

// Retransmit a parked packet now; not a timeout: neither its backoff nor the RTO grows.
// Not into a slot reported async: there the switch answers the packet when it arrives (counts
// it, or ACKs a counted one), or holds it silently in a round latched partial before the swap,
// where a copy is dropped silently too; only a loss needs the copy, and the packet's timer
// covers it. A copy sent on no sign of loss may meet the slot behind my next contribution
// (the uplink need not keep order) and its round field, from another numbering than that
// contribution's sequence number, is not behind it: counted twice (seed 9079057).
void Flights::hurry(uint32_t i, double now) {
  Flight& f = *slots_[i].flight;
  if (slots_[i].mode == ASYNC && !faults_.hurry_into_async) return;
  if (!f.stale) {  // else its grace timer decides it within one RTO anyway
    f.backoff = rto_.value();
    transmit(i, now, true, false);
  }
}

// Slot i's flight sat in a round (sync or partial) that closed with my bit on another chunk:
// another contribution of mine, one an aborted call forgot, held my place there, so the switch
// dropped this packet as my duplicate without a word, and no answer to it will come; or it has
// yet to arrive, and its answer will. Either way its round is gone: a copy now meets the closed
// round (RESEND, the slot's last; STALE_ROUND past it) and settles it as carried, or, were the
// slot to turn async meanwhile, is counted there as the RTO's copy would be - only sooner. Left
// to its timer, it waited out the RTO, up to rto_max after the faults, and its call ran that
// far behind the others: their rounds of the next keys waited for it, their packets parked
// there held their slots, and a member's chunks reached no round in three calls (seed 10036437:
// a member's chunk 7, dropped in slot 24's round of chunk 3 that held its bit from call 0, waited
// 0.5 s after that round's RESULT; the others' key-2 chunk 8 parked in slot 21's round of chunk
// 0 waiting for it).
void Flights::closed_by_my_other(uint32_t i, double now) {
  Flight* f = slots_[i].flight.get();
  if (!f || faults_.closed_by_my_other_waits_rto) return;
  hurry(i, now);
}

// A reply reported slot i's mode. If it is no longer partial while this call's chunks there were
// carried because a parked packet held the slot, they are pending again.
void Flights::follow_mode(uint32_t i, double now) {
  if (!call_ || call_->held[i].empty() || slots_[i].mode == PARTIAL) return;
  Call& c = *call_;
  for (int64_t local : c.held[i]) {
    if (c.outcome[std::size_t(local)] == Outcome::CARRIED) {  // not SETTLED meanwhile
      c.outcome[std::size_t(local)] = Outcome::PENDING;
      ++c.remaining;
      c.queues[i].push_back(local);
    }
  }
  c.held[i].clear();
  waits_since_[i] = now;
  Flight* f = slots_[i].flight.get();
  if (!f)
    send_next(i, now);
  else if (f->parked)
    hurry(i, now);
}

// The slot is held by a parked packet: this call's chunks there are carried (unsent).
void Flights::carry_queue(uint32_t i) {
  if (!call_) return;
  Call& c = *call_;
  for (int64_t local : c.queues[i]) {
    if (c.outcome[std::size_t(local)] == Outcome::PENDING) {
      c.outcome[std::size_t(local)] = Outcome::CARRIED;
      c.held[i].push_back(local);
      --c.remaining;
    }
  }
  c.queues[i].clear();
}

void Flights::rtt_sample(uint32_t i, const Flight& f, double now) {
  if (f.tries != 1) return;  // Karn: an answer to a retransmission says nothing about the RTT
  if (f.held_for_others) return;  // a wait for the others, not a round trip (Replies::on_full)
  rto_.sample(f.sent_at, now, slots_[i].mode == SYNC || slots_[i].mode == ASYNC);
}

void Flights::path_sample(uint32_t i, double now) {
  const Flight* f = slots_[i].flight.get();
  if (f && f->tries == 1) rto_.sample_path(f->sent_at, now);  // Karn, as rtt_sample
}

// ------------------------------------------------------------------ outcomes
std::unique_ptr<Flight> Flights::new_flight() {
  std::unique_ptr<Flight> f;
  if (spare_flights_.empty()) {
    f = std::make_unique<Flight>();
  } else {
    f = std::move(spare_flights_.back());
    spare_flights_.pop_back();
    static_cast<FlightState&>(*f) = FlightState{};
  }
  f->call = call_ ? calls_ : 0;
  return f;
}

void Flights::end_flight(uint32_t i) {
  spare_flights_.push_back(std::move(slots_[i].flight));
  --inflight_;
}

// The fate of slot i's flight is known (RULE B); the slot moves on to its next chunk.
void Flights::done(uint32_t i, bool included, double now, bool send_next_chunk,
                  const uint8_t* round, bool progress) {
  Flight& f = *slots_[i].flight;
  rtt_sample(i, f, now);
  answered_seq_ = std::max(answered_seq_, f.sent_seq);
  // Progress of the call under way, which puts off its JOINs (join_after). Not a displaced
  // chunk an earlier call chased at its end (send_chased): it settles in a round of another
  // call's chunk, however long this call's own rounds have waited, and counted, it put off
  // the JOIN of this call's idle slots, where a round lacking only me waited past a peer's
  // packet deadline (seed 9061566).
  if (progress && (!f.chase || f.call == calls_ || faults_.progress_from_any_flight))
    progress_at_ = now;
  if (f.kind == Kind::OWN && f.parked) {
    if (!included) keys_.restore(f, round);
  } else if (f.kind == Kind::OWN) {
    if (call_ && call_->key == f.key &&
        call_->outcome[std::size_t(f.local)] == Outcome::PENDING) {
      keys_.settle(*call_, f.local, included ? Outcome::INCLUDED : Outcome::CARRIED, &f, round);
      --call_->remaining;
    }
  } else if (f.kind == Kind::RESIDUAL) {
    keys_.return_residual(f, included, round);
  }
  end_flight(i);
  if (send_next_chunk) send_next(i, now);
}

// Forget every packet in flight as not counted: RULE B keeps its amount as residual. What is
// queued and not yet sent is discarded: it belongs to these flights (a reply handled in the
// same batch as the one that told of a new switch state may have launched one), and sent
// after they are forgotten, the new state would count what the residual holds again.
void Flights::drop_all() {
  if (!faults_.send_dropped) io_.discard();
  for (uint32_t i = 0; i < w_; ++i) {
    Flight* f = slots_[i].flight.get();
    slots_[i].forgot = f && !f->async_style;
    if (!f) continue;
    slots_[i].forgot_round = f->round;
    slots_[i].forgot_chunk = f->chunk;
    if (f->kind == Kind::OWN && call_ && f->key == call_->key && !f->parked) {
      keys_.settle(*call_, f->local, Outcome::CARRIED, f);
    } else if (f->kind == Kind::RESIDUAL) {
      keys_.return_residual(*f, false);
    } else if (f->parked) {
      keys_.restore(*f);
    }
    end_flight(i);
  }
  timers_ = decltype(timers_)();
}

std::string Flights::describe() const {
  std::string out;
  int shown = 0, total = 0;
  for (uint32_t i = 0; i < w_; ++i) {
    const Flight* f = slots_[i].flight.get();
    if (!f) continue;
    if (++total > 8) continue;
    ++shown;
    if (!out.empty()) out += "; ";
    out += "slot " + std::to_string(cfg_.slot_base + i) + ": " +
           (f->kind == Kind::OWN ? "own" : f->kind == Kind::RESIDUAL ? "residual" : "null") +
           " chunk " + std::to_string(f->chunk) + (f->async_style ? " seq " : " round ") +
           std::to_string(f->round) + " tries " + std::to_string(f->tries) +
           (f->stale ? " stale" : "") + (f->closed ? " closed" : "") +
           (f->parked ? " parked" : "") + (f->join ? " join" : "") + " (next_round " +
           std::to_string(slots_[i].next_round) + ", mode " + std::to_string(slots_[i].mode) + ")";
  }
  if (total > shown) out += "; ... " + std::to_string(total - shown) + " more";
  return out.empty() ? "nothing in flight" : out;
}

// ------------------------------------------------------------------ what replies decide
void Flights::stale_reply(uint32_t i, uint8_t reason, uint8_t mode, double now) {
  Flight* f = slots_[i].flight.get();
  if (f->probe) {  // first contact: no older packet of mine exists to confuse it with
    f->stale = true;
    f->stale_reason = reason;
    f->stale_mode = mode;
    f->stale_resets = rounds_.resets();
    decide_stale(i, now);
    return;
  }
  if (!f->stale) {
    f->gen = ++gen_;
    timers_.push({now + rto_.value(), f->gen, i});
  }
  f->stale = true;  // the latest plausible reply wins
  f->stale_reason = reason;
  f->stale_mode = mode;
  f->stale_resets = rounds_.resets();
}

void Flights::refused(uint32_t i, uint8_t mode, double now) {
  Flight& f = *slots_[i].flight;
  f.stale_reason = uint8_t(wire::ResyncReason::STALE_ROUND);
  f.stale_mode = mode;
  decide_stale(i, now);
}

// A STALE reply stood for a grace period without the round's result arriving.
void Flights::decide_stale(uint32_t i, double now) {
  Flight& f = *slots_[i].flight;
  f.stale = false;
  // A reset since the reply (a call's timers run before it aborts on a new state, Engine::
  // step): the reply was the state left's, and the round it counted the flight in is that
  // state's, not a round of the new one (seed 9109296).
  if (f.stale_reason == STALE_COUNTED)
    counted_without_result(i, now,
                           f.stale_resets == rounds_.resets() || faults_.state_left_teaches_rounds);
  else
    not_counted(i, f.stale_mode, now);
}

void Flights::not_counted(uint32_t i, uint8_t mode, double now) {
  if (slots_[i].flight->async_style || mode == SYNC)
    launch(i, nullptr, now);  // again at the open round
  else
    done(i, false, now);  // partial (its round is gone) or refused in async: carried, not chased
}

// ACK / STALE_COUNTED: the switch's member_seq holds the flight's round field, so it was
// counted, and its result did not reach me.
void Flights::counted_without_result(uint32_t i, double now, bool of_state_known) {
  Flight& f = *slots_[i].flight;
  // Unless its round closed with my bit on another chunk: member_seq then holds the round of
  // that other contribution of mine (a packet an aborted call forgot, counted after the
  // abort), and this packet, of another chunk, met that record, not its own count. Settled
  // as counted, its amount would leave the residual and reach no round. Unless the switch had
  // refused this flight's sequence number with my bit in that round: the refusal mark replaced
  // the other's record, so this answer is the flight's own count (seeds 9019369, 9000692: the
  // flight, held behind the other in the round, was counted in async once the slot turned).
  // The worker knows it without that round's RESULT too where it sent this flight at the round
  // of a packet of another chunk that its last abort forgot on the slot: an answer of that
  // round may be the forgotten packet's count, and taken for this flight's, it would lose the
  // flight's amount; taken for "not counted", the worse case counts it twice, a fate the
  // abort's resync flag covers (seed 9044368: a restart's new state counted the forgotten
  // chunk 1 in round 1, the next call's chunk 15 was sent there and dropped as my duplicate,
  // the round's RESULT was lost, and its retransmission was answered STALE_COUNTED).
  const bool my_other =
      f.closed_by_my_other || (f.at_forgotten_round && !faults_.forgotten_round_unread);
  if (my_other && !f.refused_over_my_other && !faults_.my_other_copy_settles) {
    if (!f.closed_by_my_other)
      stats_.forgotten_round_refused.insert(stats_.forgotten_round_refused.end(),
                                            f.data.begin(), f.data.end());
    not_counted(i, slots_[i].mode, now);
    return;
  }
  // Round 0 is no exception: a member_seq cell this install never wrote does not match (its
  // member_epoch differs, §4 step 8), so an ACK or STALE_COUNTED for a round-0 packet means the
  // switch counted it - after a swap to async, with the round field as its sequence number.
  // Taking that for "not counted" sent the same amount again with the chunk's next value.
  if (f.async_style || f.closed) {
    // Counted in an async round (a sync-style packet whose round closed without me can only
    // have been counted after the slot turned async): its result is exactly my lanes / 1.
    results_.apply_own(i, f);
  } else if (of_state_known) {
    // Counted in sync round f.round, its result late or lost - or in an async round, if the
    // slot turned async before the packet (or a retransmission) arrived: its result is then a
    // round of one with my lanes, which the next packet of this chunk and lanes would take for
    // its own, counted behind its floor (Replies::on_full). Remembered as an ACKed twin, that
    // result is told apart: applied (RULE A: no ACK applied it) and no flight settled by it
    // (seed 9102569: a one-element key of -inf, every call's packet alike). Counted by a state
    // a reset left, it teaches the new state nothing (seed 9109296).
    if (!faults_.ack_leaves_no_suspect) rounds_.advance(i, f.round + 1);
    if (!faults_.acked_sync_leaves_no_twin) results_.remember_twin(i, f);
  }
  done(i, true, now);
}

// CHUNK_MISMATCH: the open round `rnd` aggregates `chunk`; contribute to it: my own `chunk` if
// it is pending in this call, else its residual (zeros if no key owns it and the round is
// sync). The flight's own chunk is carried (RULE B), in every mode, rather than chased into a
// round of its own at once: the members' calls do not pair on this slot (where they pair,
// every member sends a slot's chunks in the same order), so such a round would wait for the
// others to come back to this key, which can be calls away, and would hold back the rest of
// this call's chunks on the slot. In sync, once the slot's queue is empty, the carried chunk
// goes out again as residual (send_chased), until it reaches a round: a member that meets that
// round with another chunk joins it the same way, so it closes, and no chunk is displaced at
// every call.
// A residual or a JOIN in flight gives its amount back and joins the round instead.
void Flights::retarget(uint32_t i, uint32_t chunk, uint32_t rnd, uint8_t mode, double now) {
  const int64_t local = call_ ? call_->pending(keys_.at(call_->key), chunk, i) : -1;
  int k = -1;
  if (local < 0) {
    k = keys_.owner(chunk);
    if (k >= 0 && !keys_.at(k).alive) k = -1;
  }
  if (local < 0 && k < 0 && mode != SYNC) return;  // a partial round closes without me
  Flight& f = *slots_[i].flight;
  const bool join = f.join;
  if (mode == SYNC && !f.parked && (f.kind == Kind::OWN || f.chase)) chase(i, f.chunk);
  // Partial: my chunk of the call, displaced by a round of another chunk of its key, is
  // offered again once that round closes (round_closed).
  if (mode == PARTIAL && !faults_.no_reoffer && call_ && !f.parked && f.key == call_->key &&
      (f.kind == Kind::OWN ? call_->outcome[std::size_t(f.local)] == Outcome::PENDING
                           : f.kind == Kind::RESIDUAL && f.reoffer) &&
      (local >= 0 || k == call_->key))
    call_->displaced[i].push_back({f.local, rnd});
  if (mode != SYNC || f.parked || f.kind == Kind::OWN) {
    done(i, false, now, false);
  } else {
    if (f.kind == Kind::RESIDUAL) keys_.return_residual(f, false);
    end_flight(i);
  }
  if (local >= 0) {
    auto& q = call_->queues[i];
    q.erase(std::find(q.begin(), q.end(), local));
    send_own(i, local, &rnd, now);
  } else if (k >= 0) {
    // A chunk of the call queued to be offered again is offered here, in the round it met.
    const bool reoffer = call_ && k == call_->key &&
                         call_->reoffer[std::size_t(keys_.at(k).local_of(chunk))];
    if (reoffer) drop_reoffer(i, keys_.at(k).local_of(chunk));
    send_extra(i, Kind::RESIDUAL, k, chunk, rnd, now, join);
    slots_[i].flight->reoffer = reoffer;
  } else {
    send_extra(i, Kind::NULLS, -1, chunk, rnd, now, join);
  }
}

// ------------------------------------------------------------------ the switch's silence
// How long the switch has been silent while this worker waited on it: since the first packet
// sent after the last reply heard (not since that reply: a worker computing between calls sends
// nothing and waits on nothing).
// Written as next_wake() writes the deadline: the same floating-point sum.
bool Flights::silent_too_long(double now) const {
  return unanswered_since_ > last_rx_ && now >= unanswered_since_ + cfg_.dead_after;
}

// A packet of this call has waited dead_after since it was launched while replies to others
// kept silent_too_long from firing: a round latched in sync (or a partial quorum) that waits
// for a member who is gone, on a slot of a job whose other slots run async since
// (docs/protocol.md §9 Failures). The call gives up as it does on silence. Parked packets are
// settled already. A packet of another kind that holds a slot while a chunk of the call
// waits behind it counts too: a JOIN of zeros that joined such a round keeps the call's own
// chunk from ever leaving, so no packet of the call would otherwise be launched to wait.
// So does a parked packet that a chunk of the call waits behind (a call's start, hold_queue,
// or a reply that reported its slot sync or async again, follow_mode), from when that chunk
// began to wait if later than its launch: parked in partial, then relaunched into a sync
// round latched with a dead member, it held the call's chunk for ever (seed 9102095).
// And from the last RESULT heard whose bitmap holds every member, if later: that round
// closed with each member alive and at work, so a round of the call still open waits for
// members out of step, not gone, and closes by their JOINs once their own calls stall
// (join_after after their last progress, a round trip for the CHUNK_MISMATCH or STALE answer,
// another for the JOIN sent again). Counted from launch, behind a slow switch that comes
// after dead_after (seed 9132941: worker 0's call 4, one call behind its peers, launched
// chunk 2 on slot 51 at 10.426 s into a round its peers had left; their last round with
// worker 0, on slot 49, closed at 12.963 s, their JOINs there met the round at 14.807 s and
// 15.65 s, and the call failed at launch + dead_after, 15.112 s). A member that dies sends
// nothing more, so no such RESULT is heard after its last contribution, and the call still
// fails dead_after after the later of that and the launch (the dead_member rule's bound).
bool Flights::waited_too_long(double now) const { return now >= flight_deadline(); }

// The first moment waited_too_long holds, infinity if none: a timer of its own in
// next_wake(), since the replies to other slots that keep silent_too_long off need not wake
// the call near it, nor need any other timer.
double Flights::flight_deadline() const {
  double at = std::numeric_limits<double>::infinity();
  if (!call_ || faults_.no_flight_deadline) return at;
  for (uint32_t i = 0; i < w_; ++i) {
    const Flight* f = slots_[i].flight.get();
    if (!f || (f->parked && faults_.parked_flight_no_deadline)) continue;
    const bool own = !f->parked && f->kind == Kind::OWN && f->key == call_->key;
    const bool blocks = !faults_.own_flight_deadline && !call_->queues[i].empty();
    if (!own && !blocks) continue;
    double from = f->parked ? std::max(f->launched, waits_since_[i]) : f->launched;
    if (!faults_.flight_deadline_from_launch) from = std::max(from, everyone_at_);
    at = std::min(at, from + cfg_.dead_after);
  }
  return at;
}

double Flights::next_wake() const {
  double at = unanswered_since_ > last_rx_ ? unanswered_since_ + cfg_.dead_after
                                           : std::numeric_limits<double>::infinity();
  if (!timers_.empty()) at = std::min(at, timers_.top().at);
  if (call_) {
    at = std::min(at, std::max(progress_at_, joined_at_) + cfg_.join_after);
    at = std::min(at, flight_deadline());
  }
  return at;
}

double Flights::next_timer() const {
  return timers_.empty() ? std::numeric_limits<double>::infinity() : timers_.top().at;
}

}  // namespace hysync::worker
