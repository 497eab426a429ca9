#include "dataplane/reflector.h"

#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "common/bytes.h"
#include "common/udp_batch.h"
#include "dataplane/sockets.h"
#include "hysync_wire.h"

namespace hysync::dataplane {

namespace w = hysync::wire;

Reflector::Reflector(const std::string& host, uint16_t port, std::size_t threads, Answer answer)
    : answer_(answer) {
  fds_ = open_udp_group(host, port, threads == 0 ? 1 : threads);
  port_ = local_port(fds_[0]);
}

Reflector::~Reflector() {
  stop();
  for (int fd : fds_) close(fd);
}

void Reflector::start() {
  ServingThreads::start(fds_.size(), [this](std::size_t i) {
    if (answer_ == Answer::ECHO)
      echo(fds_[i]);
    else
      answer_as_results(fds_[i]);
  });
}

void Reflector::echo(int fd) {
  DatagramBatch batch(64, 2048);
  batch.set_coalescing(fd);  // the same I/O as the switch's UDP data plane
  batch.set_segmenting(true);
  pollfd readable{fd, POLLIN, 0};
  while (!stopping()) {
    std::size_t n = batch.receive(fd);
    if (n == 0) {
      poll(&readable, 1, POLL_MS);
      continue;
    }
    packets_in.fetch_add(n, std::memory_order_relaxed);
    packets_out.fetch_add(batch.echo(fd), std::memory_order_relaxed);
  }
}

// As an async switch would answer: results carry mode ASYNC and the slot's own round count;
// a contribution whose sequence number was the last one seen from its sender on its slot (a
// retransmission) is answered ACK instead of being counted twice. Anything but a whole
// contribution is not answered. The state is this thread's: the kernel steers one worker to
// one SO_REUSEPORT socket, so a sender always meets the same state.
void Reflector::answer_as_results(int fd) {
  DatagramBatch in(64, 2048), out(256, w::PACKET_BYTES);
  in.set_coalescing(fd);
  out.set_segmenting(true);
  std::vector<uint32_t> rounds(w::NUM_SLOTS, 0);
  std::vector<int64_t> seen(w::NUM_SLOTS * w::MAX_WORKERS, -1);  // -1: nothing seen yet
  pollfd readable{fd, POLLIN, 0};
  while (!stopping()) {
    const std::size_t n = in.receive(fd);
    if (n == 0) {
      poll(&readable, 1, POLL_MS);
      continue;
    }
    packets_in.fetch_add(n, std::memory_order_relaxed);
    for (std::size_t i = 0; i < n; ++i) {
      const uint8_t* d = in.data(i);
      if (in.length(i) != w::PACKET_BYTES || d[w::OFF_OP] != uint8_t(w::Op::CONTRIB)) continue;
      const uint32_t slot = load_be16(d + w::OFF_SLOT) % w::NUM_SLOTS;
      const uint32_t worker = d[w::OFF_WORKER_ID] % w::MAX_WORKERS;
      const int64_t seq = load_be32(d + w::OFF_ROUND);
      const bool again = seen[slot * w::MAX_WORKERS + worker] == seq;
      seen[slot * w::MAX_WORKERS + worker] = seq;
      const std::size_t bytes = again ? w::HEADER_BYTES : w::PACKET_BYTES;
      uint8_t* r = out.append(in.peer(i), bytes);
      if (r == nullptr) {  // a coalesced receive holds more datagrams than a send batch
        packets_out.fetch_add(out.flush(fd), std::memory_order_relaxed);
        r = out.append(in.peer(i), bytes);
      }
      std::memcpy(r, d, bytes);
      r[w::OFF_OP] = uint8_t(again ? w::Op::ACK : w::Op::RESULT);
      r[w::OFF_FLAGS] = 0;
      r[w::OFF_MODE] = uint8_t(w::Mode::ASYNC);
      if (again) continue;
      r[w::OFF_COUNT] = 1;
      store_be32(r + w::OFF_ROUND, rounds[slot]++);
      store_be32(r + w::OFF_BITMAP, 1u << worker);
    }
    packets_out.fetch_add(out.flush(fd), std::memory_order_relaxed);
  }
}

}  // namespace hysync::dataplane
