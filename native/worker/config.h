// The worker engine's configuration and its defaults: the one place they are written.
// worker/config.py's TransportConfig takes its defaults from here (hysync._core.worker.
// EngineConfig, bound in bind.cc), so Python and C++ cannot disagree.
#pragma once
#include <netinet/in.h>

#include <cstdint>

namespace hysync::worker {

struct EngineConfig {
  uint32_t job_id = 1, worker_id = 0;
  sockaddr_in switch_addr{};  // the switch's data plane (the socket backend sends there)
  uint32_t slot_base = 0;
  uint32_t slot_count = 64;  // the window W: slots this job owns, all in flight at once
  int members = 1;           // n: sizes the quantizer's clipping bound
  double scale = 1 << 20;    // the quantizer's fixed-point scale
  double rto_initial = 0.02, rto_min = 0.002, rto_max = 0.5;
  double dead_after = 5.0;  // nothing heard for this long while waiting: the switch is gone
  // Partial: park a silent contribution this long after it left if the switch answered
  // others meanwhile (else at its first timeout); docs/protocol.md, partial liveness.
  double stall_after = 0.005;
  double missed_after = 0.25;  // a skipped round not here after this long was missed
  // A call stuck this long offers its idle slots' rounds a JOIN. Longer than rto_max: a call
  // waiting out a retransmission back-off is repairing a loss, not deadlocked, and a JOIN
  // then shifts which calls' chunks meet on a slot (a dangling round after a job's last call).
  double join_after = 1.0;
  float staleness_decay = 1.0f;  // weight of a carried chunk's residual (1.0: off)
  uint64_t seed = 0;             // seeds the async sequence starts
  // The install tag of the switch's state the job was attached to (the low byte of its install
  // epoch, given with the job at attach): a reply with another tag shows a new state even
  // before this worker heard any. -1: unknown, the first RESULT or ACK heard teaches it.
  int install_tag = -1;
  // A host behind a leaf switch (docs/protocol.md §11): the leaf keeps no result of the round
  // it closed while that round's sum is at the spine, so its STALE answer for the round just
  // closed is a refusal, not a sign that the switch's state is new.
  bool behind_leaf = false;
};

}  // namespace hysync::worker
