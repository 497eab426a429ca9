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
  // The path's retransmission timeout: as value(), learned only from answers the switch sent
  // the moment my packet reached it (a round my contribution closed), and never backed off;
  // value() before any such answer. How long a packet of mine may be on its way to the
  // switch (Flights::hold_past_sync_copy), which value() - learned from answers that waited
  // in open rounds for the other members' packets - overstates by those waits.
  double path() const { return path_srtt_ < 0 ? rto_ : path_rto_; }
  // An answer at `now` to a first transmission sent at `sent_at`. `due`: a sync or async
  // answer, due once every member has sent, whose silence was the job waiting on a process.
  void sample(double sent_at, double now, bool due);
  // The same answer, one the switch sent on my packet's arrival: a sample of the path too.
  void sample_path(double sent_at, double now);
  // A timeout's retransmission at `now`.
  void back_off(double now);
  double silence_timeout(double now);

 private:
  const EngineConfig& cfg_;
  double srtt_ = -1, rttvar_ = 0, rto_, backed_off_ = 0;
  double path_srtt_ = -1, path_rttvar_ = 0, path_rto_ = 0;
  double first_answered_at_ = 0;  // the latest answer to a first transmission
  // How long answers to first transmissions lately waited in silence: the job waiting on one
  // process, not a loss (silence_timeout).
  RecentMax silences_;
};

}  // namespace hysync::worker
