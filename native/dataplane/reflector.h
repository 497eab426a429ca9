// The machine's zero-work limit for the UDP data plane: every datagram goes straight back to
// its sender, in batches (recvmmsg, then sendmmsg of the same buffers), on `threads`
// SO_REUSEPORT sockets as the switch uses. The switch's rate is read as a share of this one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dataplane/serving.h"

namespace hysync::dataplane {

class Reflector : public ServingThreads {
 public:
  Reflector(const std::string& host, uint16_t port, std::size_t threads);
  ~Reflector() override;
  uint16_t port() const { return port_; }
  void start();

 private:
  void serve(std::size_t index);
  std::vector<int> fds_;
  uint16_t port_;
};

}  // namespace hysync::dataplane
