#include "dataplane/reflector.h"

#include <poll.h>
#include <unistd.h>

#include "common/udp_batch.h"
#include "dataplane/sockets.h"

namespace hysync::dataplane {

Reflector::Reflector(const std::string& host, uint16_t port, std::size_t threads) {
  fds_ = open_udp_group(host, port, threads == 0 ? 1 : threads);
  port_ = local_port(fds_[0]);
}

Reflector::~Reflector() {
  stop();
  for (int fd : fds_) close(fd);
}

void Reflector::start() {
  ServingThreads::start(fds_.size(), [this](std::size_t i) { serve(i); });
}

void Reflector::serve(std::size_t index) {
  const int fd = fds_[index];
  DatagramBatch batch(64, 2048);
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

}  // namespace hysync::dataplane
