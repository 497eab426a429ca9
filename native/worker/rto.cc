// The retransmission timeout (rto.h).
#include "worker/rto.h"

#include <algorithm>
#include <cmath>

namespace hysync::worker {

namespace {

// A silent packet waits this many times the longest recent silence (silence_timeout), and
// at most SILENCE_CAP_S beyond the RTO: a loss at the end of a window (nothing after it to be
// answered) is sent again within it, however long the job waited on a straggler lately.
constexpr double SILENCE_MARGIN = 1.5, SILENCE_CAP_S = 0.1;

// One RTT sample into a smoothed RTT and its variation; the timeout they give (Jacobson).
double jacobson(double& srtt, double& rttvar, double sample, const EngineConfig& cfg) {
  if (srtt < 0) {
    srtt = sample;
    rttvar = sample / 2;
  } else {
    rttvar = 0.75 * rttvar + 0.25 * std::fabs(sample - srtt);
    srtt = 0.875 * srtt + 0.125 * sample;
  }
  // 4 x srtt, or srtt + 4 x rttvar (Jacobson) when the RTT jitters more than that: on a
  // loaded host spurious retransmissions otherwise feed back.
  const double rto = std::max(4.0 * srtt, srtt + 4.0 * rttvar);
  return std::clamp(rto, cfg.rto_min, cfg.rto_max);
}

}  // namespace

void Rto::sample(double sent_at, double now, bool due) {
  rto_ = jacobson(srtt_, rttvar_, now - sent_at, cfg_);
  // Sync and async answers are due once every member has sent (partial's may wait for the
  // others' next call by design): the silence this one waited through, since it left or since
  // the answer to a first transmission before it, was the job waiting on a process. (Not
  // since any answer: a probe's, first after a wait, would hide the wait.)
  if (due) silences_.add(now - std::max(sent_at, first_answered_at_), now);
  first_answered_at_ = now;
}

void Rto::sample_path(double sent_at, double now) {
  path_rto_ = jacobson(path_srtt_, path_rttvar_, now - sent_at, cfg_);
}

// Back the timer off (at most once per RTO, as TCP does): replies that only retransmitted
// packets get carry no RTT sample (Karn), so without this a queue longer than the RTO would
// keep every packet retransmitting.
void Rto::back_off(double now) {
  if (now - backed_off_ < rto_) return;
  rto_ = std::min(2.0 * rto_, cfg_.rto_max);
  backed_off_ = now;
}

// A silent packet (silent_flight) counts as lost only once it has waited through more than
// the job's recent silences that ended without a loss: on a host whose processes wait for
// cores, the job waits milliseconds to tens of them on one process over and over, and the
// RTO, learned from hundreds of answers a millisecond, forgets each wait at once. A lost
// packet meets answers to later ones and keeps the RTO; a silent one, the last of a window,
// waits at most this long (SILENCE_CAP_S).
double Rto::silence_timeout(double now) {
  const double waits = std::min(SILENCE_MARGIN * silences_.value(now), SILENCE_CAP_S);
  return std::min(std::max(rto_, waits), cfg_.rto_max);
}

}  // namespace hysync::worker
