// The zero-work servers the benches measure against, batched (recvmmsg, then sendmmsg) on
// `threads` SO_REUSEPORT sockets as the switch uses. One reflector, two answers:
//   ECHO      — every datagram straight back to its sender: the machine's UDP limit, which no
//               switch on it can beat (the softswitch's rate is read as a share of it);
//   AS_RESULT — every contribution back as its own result (op RESULT, count 1, the sender's
//               bit): a switch that does no work, so what one worker reaches against it is the
//               worker's own limit (bench/worker_bench.py reads it as a share of ECHO's).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dataplane/serving.h"

namespace hysync::dataplane {

enum class Answer { ECHO, AS_RESULT };

class Reflector : public ServingThreads {
 public:
  Reflector(const std::string& host, uint16_t port, std::size_t threads,
            Answer answer = Answer::ECHO);
  ~Reflector() override;
  uint16_t port() const { return port_; }
  void start();

 private:
  void echo(int fd);
  void answer_as_results(int fd);
  std::vector<int> fds_;
  uint16_t port_;
  Answer answer_;
};

}  // namespace hysync::dataplane
