// The engine's I/O backends (backend.h): the UDP socket's batches and waits.
#include "worker/backend.h"

#include <poll.h>
#include <time.h>

#include <cmath>
#include <cstring>

#include "hysync_wire.h"

namespace hysync::worker {

double monotonic_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

SocketBackend::SocketBackend(int fd, const sockaddr_in& to)
    : fd_(fd), to_(to), rx_(RECEIVE_BATCH, 2048), tx_(RECEIVE_BATCH, wire::PACKET_BYTES) {
  rx_.set_coalescing(fd);    // the switch's GSO runs of results arrive as one buffer each
  tx_.set_segmenting(true);  // every packet goes to the switch, all of one size
}

void SocketBackend::send(const uint8_t* data, std::size_t size) {
  uint8_t* out = tx_.append(to_, size);
  if (out == nullptr) {
    flush();
    out = tx_.append(to_, size);
  }
  std::memcpy(out, data, size);
}

void SocketBackend::flush() {
  if (tx_.size()) tx_.flush(fd_);
}

std::size_t SocketBackend::receive(DatagramSink& sink) {
  const std::size_t n = rx_.receive(fd_);
  const double now = monotonic_now();
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t size = rx_.truncated(j) ? rx_.max_bytes() + 1 : rx_.length(j);
    sink.on_datagram(rx_.data(j), size, now);
  }
  return rx_.messages();
}

bool SocketBackend::wait(double timeout) {
  timespec ts{time_t(timeout), long((timeout - std::floor(timeout)) * 1e9)};
  pollfd p{fd_, POLLIN, 0};
  return ppoll(&p, 1, &ts, nullptr) > 0;
}

}  // namespace hysync::worker
