// A load generator for the benches: windowed contributors, cheap enough that the switch, not
// the senders, is what a bench measures (batched sends and receives, no Python per packet).
//
// Each worker is one thread with its own UDP socket (127.0.0.1:base_port + worker). It keeps
// one contribution in flight per slot of its window, as a SwitchML worker does: a slot's next
// round goes out when that slot's round comes back — a RESULT (or RESEND) for it, a RESYNC
// naming the open round, or, against a reflector, the contribution itself. A slot that hears
// nothing for `rto_ms` is sent again.
#pragma once
#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace hysync::bench {

class LoadGenerator {
 public:
  LoadGenerator(const std::string& switch_host, uint16_t switch_port, uint16_t job,
                uint32_t workers, uint16_t base_port, uint16_t slot_base, uint32_t window,
                double rto_ms);
  ~LoadGenerator();
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  void start();
  void stop();
  uint64_t sent() const { return sent_.load(); }
  uint64_t completed() const { return completed_.load(); }  // rounds that came back
  uint64_t retransmits() const { return retransmits_.load(); }

 private:
  void run(uint32_t worker);
  sockaddr_in switch_addr_{};
  uint16_t job_, slot_base_;
  uint32_t window_;
  double rto_ms_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0}, completed_{0}, retransmits_{0};
};

}  // namespace hysync::bench
