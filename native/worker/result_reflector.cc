#include "worker/result_reflector.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "common/bytes.h"
#include "common/udp_batch.h"
#include "hysync_wire.h"

namespace hysync::worker {

namespace w = hysync::wire;

ResultReflector::ResultReflector(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    throw std::invalid_argument("reflector address " + host + " is not a dotted IPv4 address");
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  int buffer = 32 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int err = errno;
    if (fd_ >= 0) close(fd_);
    throw std::system_error(err, std::generic_category(), "reflector bind " + host);
  }
  socklen_t len = sizeof a;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
}

ResultReflector::~ResultReflector() {
  stop();
  close(fd_);
}

void ResultReflector::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
}

void ResultReflector::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

// As an async switch: results carry mode ASYNC and the reflector's own round per slot, and a
// contribution whose sequence number was seen last on its slot (a retransmission) is answered
// ACK instead of being counted twice.
void ResultReflector::serve() {
  DatagramBatch in(64, 2048), out(64, w::PACKET_BYTES);
  std::vector<uint32_t> rounds(w::NUM_SLOTS, 0), seen(w::NUM_SLOTS * w::MAX_WORKERS, 0);
  pollfd readable{fd_, POLLIN, 0};
  while (!stop_.load(std::memory_order_relaxed)) {
    const std::size_t n = in.receive(fd_);
    if (n == 0) {
      poll(&readable, 1, 50);
      continue;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const uint8_t* d = in.data(i);
      if (in.length(i) != w::PACKET_BYTES || d[w::OFF_OP] != uint8_t(w::Op::CONTRIB)) continue;
      const uint32_t slot = load_be16(d + w::OFF_SLOT) % w::NUM_SLOTS;
      const uint32_t worker = d[w::OFF_WORKER_ID] % w::MAX_WORKERS;
      const uint32_t seq = load_be32(d + w::OFF_ROUND);
      const bool again = seen[slot * w::MAX_WORKERS + worker] == seq;
      seen[slot * w::MAX_WORKERS + worker] = seq;
      uint8_t* r = out.append(in.peer(i), again ? w::HEADER_BYTES : w::PACKET_BYTES);
      std::memcpy(r, d, again ? w::HEADER_BYTES : w::PACKET_BYTES);
      r[w::OFF_OP] = uint8_t(again ? w::Op::ACK : w::Op::RESULT);
      r[w::OFF_FLAGS] = 0;
      r[w::OFF_MODE] = uint8_t(w::Mode::ASYNC);
      if (again) continue;
      r[w::OFF_COUNT] = 1;
      store_be32(r + w::OFF_ROUND, rounds[slot]++);
      store_be32(r + w::OFF_BITMAP, 1u << worker);
    }
    packets.fetch_add(out.size(), std::memory_order_relaxed);
    out.flush(fd_);
  }
}

}  // namespace hysync::worker
