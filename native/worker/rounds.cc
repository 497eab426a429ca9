// RULE A and the install tag (rounds.h).
#include "worker/rounds.h"

#include <algorithm>
#include <map>

namespace hysync::worker {

namespace {

constexpr uint32_t HALF32 = 1u << 31;
constexpr double SUSPECT_MEMORY = 60.0;     // seconds a suspected round may still arrive
constexpr uint32_t MAX_SUSPECT_GAP = 4096;  // more skipped rounds on one slot: don't list them

bool ahead(uint32_t a, uint32_t b) { return uint32_t(a - b) < HALF32; }  // a >= b, mod 2^32

}  // namespace

void Rounds::advance(uint32_t i, uint32_t upto) {
  const uint32_t nr = slots_[i].next_round;
  const uint32_t gap = upto - nr;
  if (!slots_[i].known || (gap != 0 && gap < HALF32)) slots_[i].taught_untagged = tag_ < 0;
  slots_[i].known = true;
  if (gap == 0 || gap >= HALF32) return;
  if (gap > MAX_SUSPECT_GAP) {
    flag_resync("slot " + std::to_string(cfg_.slot_base + i) + " jumped " +
                std::to_string(gap) + " rounds ahead");
  } else {
    auto& suspect = slots_[i].suspect;
    const double now = clock_.now();
    for (uint32_t r = 0; r < gap; ++r) suspect[nr + r] = now;
    if (std::find(suspect_slots_.begin(), suspect_slots_.end(), i) == suspect_slots_.end())
      suspect_slots_.push_back(i);
  }
  slots_[i].next_round = upto;
}

void Rounds::step_back(uint32_t i, uint32_t rnd) {
  if (slots_[i].next_round != rnd + 1) return;
  slots_[i].next_round = rnd;
  slots_[i].suspect.erase(rnd);
}

bool Rounds::is_new(uint32_t i, uint32_t rnd) {
  if (ahead(rnd, slots_[i].next_round)) {
    advance(i, rnd);
    slots_[i].next_round = rnd + 1;
    slots_[i].taught_untagged = tag_ < 0;
    return true;
  }
  auto& suspect = slots_[i].suspect;
  auto it = suspect.find(rnd);
  if (it != suspect.end()) {
    suspect.erase(it);
    return true;
  }
  return false;
}

// Count suspected rounds older than missed_after (minus one per own ACKed contribution, whose
// round is unknown); forget those older than SUSPECT_MEMORY.
void Rounds::check_suspects() {
  const double now = clock_.now();
  const double judge = now - cfg_.missed_after, forget = now - SUSPECT_MEMORY;
  uint64_t missed = 0;
  std::vector<uint32_t> keep;
  for (uint32_t i : suspect_slots_) {
    auto& suspect = slots_[i].suspect;
    auto& acked = slots_[i].acked;
    std::size_t gone = 0;
    for (auto it = suspect.begin(); it != suspect.end();) {
      if (it->second < forget) {
        it = suspect.erase(it);
        ++gone;
      } else {
        ++it;
      }
    }
    if (gone > acked.size())
      flag_resync("results of slot " + std::to_string(cfg_.slot_base + i) + " never arrived");
    for (std::size_t n = std::min(gone, acked.size()); n > 0; --n) acked.pop_front();
    if (!suspect.empty()) keep.push_back(i);
    std::size_t old = 0;
    for (const auto& [r, since] : suspect) old += since < judge;
    missed += old > acked.size() ? old - acked.size() : 0;
  }
  suspect_slots_.swap(keep);
  const bool was = needs_resync();
  missed_results_ = missed;
  if (missed && !was)
    log_resync(std::to_string(missed) + " result(s) did not arrive within " +
               std::to_string(cfg_.missed_after) + " s");
}

void Rounds::flag_resync(const std::string& why) {
  if (!needs_resync()) log_resync(why);
  if (resync_why_.empty()) resync_why_ = why;
  resync_flagged_ = true;
}

void Rounds::log_resync(const std::string& why) {
  log_(Log::WARNING, "worker " + std::to_string(cfg_.worker_id) +
              " fell out of the switch's retransmission window (" + why +
              "): its replica missed updates and must be resynchronized at the next "
              "averaging round");
}

// The replica was re-synchronized: forget missed and suspected rounds (results of those rounds
// that still arrive are dropped as duplicates).
void Rounds::clear_resync() {
  resync_why_.clear();
  resync_flagged_ = false;
  missed_results_ = 0;
  for (uint32_t i : suspect_slots_) {
    slots_[i].suspect.clear();
    slots_[i].acked.clear();
    slots_[i].twins.clear();
  }
  suspect_slots_.clear();
}

// A tag that is neither the one known nor, shortly after a change, one left is a new state of
// the switch for this job: a restart, or the job installed again (docs/protocol.md §9). Later
// than two rto_max after a change the one left is taken for a new state too: packets are not
// delayed that long, and a tag is only 8 bits (the controller gives an install a tag unlike its
// predecessor's, not unlike every older one's).
// A tag left before the last one is late too, within two rto_max of when it was left: two
// resets in quick succession leave late packets of both states on their way. Told by the tag
// left last alone, a late packet of the older state was a third state, and the tags then
// flipped to and fro: each flip a reset that forgot the slots' rounds, so the known state's
// results heard again (a copy, a RESEND) were applied twice (seed 10001822: a restart and a
// re-install 3 ms apart; a member that had applied rounds of the re-install read a late
// result of the install before the restart - a third state - and one of the restart's - a
// fourth - and the re-install's copies of those rounds were a fifth, applied again).
Rounds::Tag Rounds::see_tag(uint8_t tag, double arrived, bool older_too) {
  if (tag == tag_) return Tag::KNOWN;
  if (tag == left_tag_ && arrived - tag_changed_at_ < 2 * cfg_.rto_max) return Tag::LEFT;
  if (older_too)
    for (const TagLeft& left : older_left_)
      if (int(tag) == left.tag && arrived - left.at < 2 * cfg_.rto_max) return Tag::LEFT;
  if (tag_ < 0) {  // the first tag heard, or the first since a reset
    tag_ = tag;
    return Tag::KNOWN;
  }
  return Tag::NEW;
}

// Seen: the slot had learned its rounds, and `rnd` is behind the next one and not a suspect
// (is_new's "duplicate").
bool Rounds::seen_under_tag_left(uint8_t tag, uint32_t i, uint32_t rnd) const {
  if (int(tag) != left_tag_ || i >= left_rounds_.size()) return false;
  const LeftRounds& left = left_rounds_[i];
  return left.known && !ahead(rnd, left.next_round) && !left.suspect.count(rnd);
}

void Rounds::forget(double arrived, bool tag_may_be_new) {
  if (tag_ >= 0) {  // the next tag heard is the new state's
    if (left_tag_ >= 0) {  // still told late for a while (see_tag)
      older_left_.insert(older_left_.begin(), {left_tag_, tag_changed_at_});
      if (older_left_.size() > MAX_OLDER_LEFT) older_left_.pop_back();
    }
    left_tag_ = tag_;
    // A tag learned after the lesson that a RESYNC (no tag) now contradicts may be the very
    // state that answered: keep what the slots had seen, so that its results heard again are
    // not applied twice. Otherwise the tag left is the state that taught the rounds, for sure
    // (results of a newer install with the same tag are new, docs/protocol.md §9).
    left_rounds_.clear();
    if (tag_may_be_new) {
      left_rounds_.resize(slots_.size());
      for (std::size_t i = 0; i < slots_.size(); ++i)
        left_rounds_[i] = {slots_[i].known, slots_[i].next_round, slots_[i].suspect};
    }
  }
  tag_ = -1;
  tag_changed_at_ = arrived;
  ++resets_;
  for (Slot& s : slots_) {
    s.next_round = 0;
    s.known = false;
    s.taught_untagged = false;
    s.own_results = {};
    s.suspect.clear();
    s.acked.clear();
    s.twins.clear();
  }
  suspect_slots_.clear();
}

}  // namespace hysync::worker
