// The UDP data plane (`python -m hysync.softswitch --udp HOST:PORT`): members addressed by IP:port.
//
// Scaling: `threads` sockets bound to one address with SO_REUSEPORT, one thread each. The
// kernel spreads workers over the sockets by worker id (sockets.h), so one worker's packets
// stay in order on one thread, and the threads share nothing but the pipeline's per-slot
// locks. Each thread receives a batch (recvmmsg; a worker's UDP GSO run stays one buffer, UDP
// GRO), runs it through the pipeline under one shared batch guard, and sends every output
// grouped by destination, in UDP GSO runs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dataplane/pipeline.h"
#include "dataplane/serving.h"

namespace hysync::dataplane {

class UdpServer : public ServingThreads {
 public:
  UdpServer(Pipeline& pipeline, const std::string& host, uint16_t port, std::size_t threads);
  ~UdpServer() override;
  uint16_t port() const { return port_; }
  void start();

 private:
  void serve(std::size_t index);
  Pipeline& pipeline_;
  std::vector<int> fds_;
  std::vector<CounterShard*> shards_;
  uint16_t port_;
};

}  // namespace hysync::dataplane
