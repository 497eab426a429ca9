// The raw-interface data plane (`python -m hysync.softswitch -i PORT@IFACE ...`), as BMv2's `-i`.
//
// One AF_PACKET socket per interface, all on one thread: poll wakes it, each ready socket is
// drained in a batch (recvmmsg), the batch runs through the pipeline's frame path under one
// batch guard, and outputs leave in per-port batches (sendmmsg). Copies of frames that left
// through a port (PACKET_OUTGOING: the kernel's own neighbour discovery, another tap) are
// skipped. Ports given a delay hold their frames in a time-ordered queue (this kernel has no
// netem); the poll timeout shrinks to the next departure.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <vector>

#include "common/udp_batch.h"
#include "dataplane/pipeline.h"
#include "dataplane/serving.h"

namespace hysync::dataplane {

class RawServer : public ServingThreads {
 public:
  RawServer(Pipeline& pipeline, const std::map<uint16_t, std::string>& ports,
            const std::map<uint16_t, double>& delays_ms);
  ~RawServer() override;
  void start();
  uint64_t unmapped() const { return unmapped_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Delayed {
    Clock::time_point due;
    uint64_t order;
    uint16_t port;
    std::vector<uint8_t> frame;
    bool operator>(const Delayed& o) const { return due != o.due ? due > o.due : order > o.order; }
  };
  void serve();
  void emit(uint16_t port, const uint8_t* frame, std::size_t len);
  void send_due();
  int poll_timeout_ms() const;

  Pipeline& pipeline_;
  CounterShard& shard_;
  std::map<uint16_t, int> fds_;
  std::map<uint16_t, Clock::duration> delays_;
  std::priority_queue<Delayed, std::vector<Delayed>, std::greater<Delayed>> queue_;
  uint64_t order_ = 0;
  std::atomic<uint64_t> unmapped_{0};
  std::map<uint16_t, std::unique_ptr<DatagramBatch>> tx_;  // per port
};

}  // namespace hysync::dataplane
