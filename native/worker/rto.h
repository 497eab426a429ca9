// The retransmission timeout: smoothed RTT and its variation from answers to first
// transmissions (Jacobson; Karn's rule is the caller's: retransmitted flights give no sample),
// backed off at most once per RTO, and how long the job lately waited in silence on one
// process (silence_timeout), which a silent packet waits out before it counts as lost.
#pragma once
#include "worker/config.h"
#include "worker/recent_max.h"

namespace hysync::worker {

class Rto {
 public:
  explicit Rto(const EngineConfig& config) : cfg_(config), rto_(config.rto_initial) {}
  double value() const { return rto_; }
  double srtt() const { return srtt_; }  // < 0: no sample yet
  // An answer at `now` to a first transmission sent at `sent_at`. `due`: a sync or async
  // answer, due once every member has sent, whose silence was the job waiting on a process.
  void sample(double sent_at, double now, bool due);
  // A timeout's retransmission at `now`.
  void back_off(double now);
  double silence_timeout(double now);

 private:
  const EngineConfig& cfg_;
  double srtt_ = -1, rttvar_ = 0, rto_, backed_off_ = 0;
  double first_answered_at_ = 0;  // the latest answer to a first transmission
  // How long answers to first transmissions lately waited in silence: the job waiting on one
  // process, not a loss (silence_timeout).
  RecentMax silences_;
};

}  // namespace hysync::worker
