#include "bench/loadgen.h"

#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "common/bytes.h"
#include "common/udp_batch.h"
#include "dataplane/sockets.h"
#include "hysync_wire.h"

namespace hysync::bench {

namespace w = wire;
using Clock = std::chrono::steady_clock;

LoadGenerator::LoadGenerator(const std::string& switch_host, uint16_t switch_port,
                             uint16_t job, uint32_t workers, uint16_t base_port,
                             uint16_t slot_base, uint32_t window, double rto_ms)
    : job_(job), slot_base_(slot_base), window_(window), rto_ms_(rto_ms) {
  if (workers == 0 || workers > w::MAX_WORKERS || window == 0)
    throw std::invalid_argument("a load generator needs 1-32 workers and a window of >= 1 slot");
  switch_addr_.sin_family = AF_INET;
  switch_addr_.sin_port = htons(switch_port);
  if (inet_pton(AF_INET, switch_host.c_str(), &switch_addr_.sin_addr) != 1)
    throw std::invalid_argument(switch_host + " is not an IPv4 address");
  try {
    for (uint32_t i = 0; i < workers; ++i)
      fds_.push_back(dataplane::open_udp("127.0.0.1", uint16_t(base_port + i), false));
  } catch (...) {
    for (int fd : fds_) close(fd);
    throw;
  }
}

LoadGenerator::~LoadGenerator() {
  stop();
  for (int fd : fds_) close(fd);
}

void LoadGenerator::start() {
  stop_.store(false);
  for (uint32_t i = 0; i < fds_.size(); ++i) threads_.emplace_back([this, i] { run(i); });
}

void LoadGenerator::stop() {
  stop_.store(true);
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void LoadGenerator::run(uint32_t worker) {
  const int fd = fds_[worker];
  std::vector<uint8_t> packet(w::PACKET_BYTES, 0);
  packet[w::OFF_VERSION] = w::VERSION;
  packet[w::OFF_OP] = uint8_t(w::Op::CONTRIB);
  store_be16(&packet[w::OFF_JOB_ID], job_);
  packet[w::OFF_WORKER_ID] = uint8_t(worker);
  for (uint32_t i = 0; i < w::LANES; ++i)
    store_be32(&packet[w::HEADER_BYTES + 4 * i], i + worker);
  std::vector<uint32_t> next_round(window_, 0);
  std::vector<Clock::time_point> sent_at(window_);
  DatagramBatch rx(64, 2048), tx(window_ < 256 ? window_ : 256, w::PACKET_BYTES);
  rx.set_coalescing(fd);
  tx.set_segmenting(true);
  const auto rto = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(rto_ms_));
  uint64_t sent = 0, completed = 0, retransmits = 0;
  auto send = [&](uint32_t i, Clock::time_point now) {
    uint8_t* out = tx.append(switch_addr_, w::PACKET_BYTES);
    if (out == nullptr) {
      tx.flush(fd);
      out = tx.append(switch_addr_, w::PACKET_BYTES);
    }
    std::memcpy(out, packet.data(), w::PACKET_BYTES);
    store_be16(out + w::OFF_SLOT, uint16_t(slot_base_ + i));
    store_be32(out + w::OFF_ROUND, next_round[i]);
    sent_at[i] = now;
    ++sent;
  };
  auto now = Clock::now();
  for (uint32_t i = 0; i < window_; ++i) send(i, now);
  tx.flush(fd);
  auto last_sweep = now;
  pollfd readable{fd, POLLIN, 0};
  while (!stop_.load(std::memory_order_relaxed)) {
    std::size_t n = rx.receive(fd);
    now = Clock::now();
    if (n == 0) poll(&readable, 1, 5);
    for (std::size_t k = 0; k < n; ++k) {
      if (rx.length(k) < w::HEADER_BYTES) continue;
      const uint8_t* d = rx.data(k);
      const uint32_t i = uint32_t(load_be16(d + w::OFF_SLOT)) - slot_base_;
      if (i >= window_) continue;
      const uint32_t round = load_be32(d + w::OFF_ROUND);
      const uint8_t op = d[w::OFF_OP];
      if (op == uint8_t(w::Op::RESYNC)) {
        next_round[i] = round;
      } else if ((op == uint8_t(w::Op::RESULT) || op == uint8_t(w::Op::CONTRIB)) &&
                 round == next_round[i]) {
        next_round[i] = round + 1;
        ++completed;
      } else {
        continue;
      }
      send(i, now);
    }
    if (now - last_sweep > rto / 2) {
      for (uint32_t i = 0; i < window_; ++i)
        if (now - sent_at[i] > rto) {
          send(i, now);
          ++retransmits;
        }
      last_sweep = now;
    }
    tx.flush(fd);
    sent_.fetch_add(sent, std::memory_order_relaxed);
    completed_.fetch_add(completed, std::memory_order_relaxed);
    retransmits_.fetch_add(retransmits, std::memory_order_relaxed);
    sent = completed = retransmits = 0;
  }
}

}  // namespace hysync::bench
