// The zero-work switch for one worker (bench/worker_bench.py): every contribution goes straight
// back as its own result (op RESULT, count 1, the sender's bit), in recvmmsg/sendmmsg batches on
// one thread. What a worker reaches against it is the worker's own limit; the bench reads it as
// a share of the machine's UDP loopback limit (the plain echo reflector).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace hysync::worker {

class ResultReflector {
 public:
  ResultReflector(const std::string& host, uint16_t port);
  ~ResultReflector();
  ResultReflector(const ResultReflector&) = delete;
  ResultReflector& operator=(const ResultReflector&) = delete;
  uint16_t port() const { return port_; }
  void start();
  void stop();
  std::atomic<uint64_t> packets{0};

 private:
  void serve();
  int fd_;
  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace hysync::worker
