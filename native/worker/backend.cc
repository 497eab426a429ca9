// The engine's I/O backends (backend.h): the UDP socket's batches and waits.
#include "worker/backend.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <system_error>

#include "hysync_wire.h"

namespace hysync::worker {

double monotonic_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

namespace {

double realtime_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace

SocketBackend::SocketBackend(int fd, const sockaddr_in& to)
    : fd_(fd),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      to_(to),
      rx_(RECEIVE_BATCH, 2048),
      tx_(RECEIVE_BATCH, wire::PACKET_BYTES) {
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  rx_.set_coalescing(fd);    // the switch's GSO runs of results arrive as one buffer each
  rx_.set_timestamping(fd);  // when each arrived, for a late packet of a state left (rounds.h)
  tx_.set_segmenting(true);  // every packet goes to the switch, all of one size
}

SocketBackend::~SocketBackend() { ::close(wake_fd_); }

void SocketBackend::wake() {
  const uint64_t one = 1;
  // Only fails when the counter would overflow: it is readable already.
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
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
  if (closed()) return tx_.discard();
  if (tx_.size()) tx_.flush(fd_);
}

std::size_t SocketBackend::receive(DatagramSink& sink) {
  if (closed()) return 0;
  const std::size_t n = rx_.receive(fd_);
  const double now = monotonic_now();
  // The kernel stamps arrivals on the real-time clock; the engine's is monotonic. Both are
  // read in user space (vDSO), once per batch.
  const double realtime_to_monotonic = n ? now - realtime_now() : 0;
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t size = rx_.truncated(j) ? rx_.max_bytes() + 1 : rx_.length(j);
    const double stamp = rx_.arrival(j);  // 0: none (the socket refused timestamps)
    const double arrived = stamp > 0 ? std::min(now, stamp + realtime_to_monotonic) : now;
    sink.on_datagram(rx_.data(j), size, now, arrived);
  }
  return rx_.messages();
}

bool SocketBackend::wait(double timeout) {
  if (closed()) return false;
  timespec ts{time_t(timeout), long((timeout - std::floor(timeout)) * 1e9)};
  pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  return ppoll(p, 2, &ts, nullptr) > 0 && !closed() && p[0].revents != 0;
}

}  // namespace hysync::worker
