// What every native data plane shares: threads that run a loop until stop(), and the packet
// totals they keep. Sockets are opened by the constructor (errors surface there, before any
// thread starts) and closed by the destructor.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace hysync::dataplane {

class ServingThreads {
 public:
  ServingThreads() = default;
  ServingThreads(const ServingThreads&) = delete;
  ServingThreads& operator=(const ServingThreads&) = delete;
  virtual ~ServingThreads() { stop(); }

  // Runs loop(i) on `n` threads; each returns when stopping() is true.
  void start(std::size_t n, const std::function<void(std::size_t)>& loop) {
    if (!threads_.empty()) return;
    stop_.store(false);
    for (std::size_t i = 0; i < n; ++i) threads_.emplace_back(loop, i);
  }
  void stop() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }

  std::atomic<uint64_t> packets_in{0}, packets_out{0}, send_errors{0};

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// How long a loop sleeps in poll() before it looks at stopping() again.
inline constexpr int POLL_MS = 100;

}  // namespace hysync::dataplane
