// RULE A: the rounds each slot has seen close, the ones it skipped (suspected missed until
// their results arrive), whether the replica missed results it cannot get back (needs a
// resync), and the install tag of the switch's state the rounds were learned from
// (docs/protocol.md §9).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/config.h"
#include "worker/log.h"
#include "worker/slot.h"

namespace hysync::worker {

class Rounds {
 public:
  // `clock`: the engine's backend, whose time stamps a suspect.
  Rounds(const EngineConfig& config, std::vector<Slot>& slots, Log& log, const Backend& clock)
      : cfg_(config), slots_(slots), log_(log), clock_(clock), tag_(config.install_tag) {}

  // Slot i's rounds before `upto` are closed: suspect those not seen yet.
  void advance(uint32_t i, uint32_t upto);
  // Slot i's round `rnd`, the one before the round learned last, is open again (a leaf took
  // it back open for the spine, docs/protocol.md §11): it is the next round, not a suspect.
  void step_back(uint32_t i, uint32_t rnd);
  // A result of round `rnd` on slot i: true the first time (a round ahead, or a suspect).
  bool is_new(uint32_t i, uint32_t rnd);
  // Count suspected rounds older than missed_after as missed; forget very old ones.
  void check_suspects();

  // Safe to read from another thread while a call runs.
  bool needs_resync() const { return resync_flagged_ || missed_results_ > 0; }
  uint64_t missed_results() const { return missed_results_; }
  void flag_resync(const std::string& why);
  // The replica was re-synchronized: forget missed and suspected rounds.
  void clear_resync();

  // The install tag a RESULT or ACK carries, as this worker knows the switch's state, for a
  // datagram that arrived at `arrived` (a late packet of the state left is told by when it
  // arrived, not by when it is read: a worker reads between calls what came during them).
  // `older_too`: a tag left before the last one is told late by the same window, counted from
  // when it was left (seed 10001822; Faults::one_tag_left takes it out).
  enum class Tag { KNOWN, LEFT, NEW };  // LEFT: a late packet of a state before
  Tag see_tag(uint8_t tag, double arrived, bool older_too = true);
  int tag() const { return tag_; }  // -1: none yet
  void learn_tag(uint8_t tag) { tag_ = tag; }
  // A result of the tag left, of round `rnd` on slot i, that the slot had seen under that tag
  // when the reset forgot its rounds (docs/protocol.md §9): the tag is heard again, so the
  // state may be the very one this worker knew - the reset was shown by a reply with no tag
  // (a RESYNC), against rounds learned from a state whose tag it never heard.
  bool seen_under_tag_left(uint8_t tag, uint32_t i, uint32_t rnd) const;
  // Slot i's next round was taught while no tag was known, and a tag is known now: learned
  // after that lesson, it may be a later state's than the one that taught it.
  bool taught_before_tag(uint32_t i) const {
    return tag_ >= 0 && slots_[i].known && slots_[i].taught_untagged;
  }
  // The switch's state for the job is new, as a datagram that arrived at `arrived` showed:
  // every slot forgets its rounds, the tag known becomes the one left, and the next tag heard
  // is learned. `tag_may_be_new`: the state that showed itself new may be the tag known's
  // (taught_before_tag of the slot it showed on): what the slots had seen is kept under it.
  void forget(double arrived, bool tag_may_be_new = false);
  // How many times forget() ran: a reply taken before a later reset is the state left's.
  uint64_t resets() const { return resets_; }

 private:
  void log_resync(const std::string& why);

  const EngineConfig& cfg_;
  std::vector<Slot>& slots_;
  Log& log_;
  const Backend& clock_;
  std::vector<uint32_t> suspect_slots_;  // slots with suspects
  std::atomic<uint64_t> missed_results_{0};
  std::atomic<bool> resync_flagged_{false};
  std::string resync_why_;  // what cannot heal: aborts, huge gaps
  int tag_;            // the install tag of the switch's state this worker knows (-1: none yet)
  int left_tag_ = -1;  // the one before: its late packets are not taken for a newer state
  // Where a reset left a tag that may be the state that showed itself new (forget's
  // `tag_may_be_new`): each slot's rounds as it found them (next round, suspects); the rounds
  // seen there are the ones seen under that tag.
  struct LeftRounds {
    bool known = false;
    uint32_t next_round = 0;
    std::map<uint32_t, double> suspect;
  };
  std::vector<LeftRounds> left_rounds_;
  double tag_changed_at_ = 0;  // when left_tag_ was left
  // The tags left before left_tag_, each with when it was left, the latest first (at most
  // MAX_OLDER_LEFT): after two resets in quick succession (a restart, then a re-install) late
  // packets of the state before the one left are still on their way (Rounds::see_tag).
  struct TagLeft {
    int tag;
    double at;
  };
  static constexpr std::size_t MAX_OLDER_LEFT = 8;
  std::vector<TagLeft> older_left_;
  uint64_t resets_ = 0;
};

}  // namespace hysync::worker
