#include "common/udp_batch.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace hysync {

DatagramBatch::DatagramBatch(std::size_t capacity, std::size_t max_bytes)
    : capacity_(capacity),
      max_bytes_(max_bytes),
      buffers_(capacity * max_bytes),
      addrs_(capacity),
      iovs_(capacity),
      msgs_(capacity) {}

std::size_t DatagramBatch::receive(int fd, bool wait) {
  for (std::size_t i = 0; i < capacity_; ++i) {
    iovs_[i] = {&buffers_[i * max_bytes_], max_bytes_};
    std::memset(&msgs_[i], 0, sizeof(mmsghdr));
    msgs_[i].msg_hdr.msg_iov = &iovs_[i];
    msgs_[i].msg_hdr.msg_iovlen = 1;
    msgs_[i].msg_hdr.msg_name = &addrs_[i];
    msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
  }
  for (;;) {
    int n = recvmmsg(fd, msgs_.data(), unsigned(capacity_), wait ? MSG_WAITFORONE : MSG_DONTWAIT,
                     nullptr);
    if (n >= 0) {
      count_ = std::size_t(n);
      return count_;
    }
    if (errno == EINTR) continue;
    count_ = 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    // ICMP port unreachable from an earlier send surfaces here on a connected peer; not fatal.
    if (errno == ECONNREFUSED) return 0;
    throw std::system_error(errno, std::generic_category(), "recvmmsg");
  }
}

uint8_t* DatagramBatch::append(const sockaddr_in& dst, std::size_t len) {
  uint8_t* buffer = append(len);
  if (buffer == nullptr) return nullptr;
  std::size_t i = count_ - 1;
  std::memcpy(&addrs_[i], &dst, sizeof(dst));
  msgs_[i].msg_hdr.msg_name = &addrs_[i];
  msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
  return buffer;
}

uint8_t* DatagramBatch::append(std::size_t len) {
  if (count_ == capacity_ || len > max_bytes_) return nullptr;
  std::size_t i = count_++;
  iovs_[i] = {&buffers_[i * max_bytes_], len};
  std::memset(&msgs_[i], 0, sizeof(mmsghdr));
  msgs_[i].msg_hdr.msg_iov = &iovs_[i];
  msgs_[i].msg_hdr.msg_iovlen = 1;
  return &buffers_[i * max_bytes_];
}

void DatagramBatch::group_by_peer() {
  auto peer_key = [](const mmsghdr& m) {
    const auto* a = static_cast<const sockaddr_in*>(m.msg_hdr.msg_name);
    return a == nullptr ? uint64_t(0) : uint64_t(a->sin_addr.s_addr) << 16 | a->sin_port;
  };
  // Each mmsghdr points at its own buffer and address, so moving the headers moves datagrams.
  std::stable_sort(msgs_.begin(), msgs_.begin() + long(count_),
                   [&](const mmsghdr& a, const mmsghdr& b) { return peer_key(a) < peer_key(b); });
}

std::size_t DatagramBatch::echo(int fd) {
  for (std::size_t i = 0; i < count_; ++i) {
    iovs_[i].iov_len = msgs_[i].msg_len;
    msgs_[i].msg_hdr.msg_flags = 0;
  }
  return flush(fd);
}

std::size_t DatagramBatch::flush(int fd) {
  std::size_t sent = 0, failed = 0;
  int stalls = 0;
  while (sent < count_) {
    int n = sendmmsg(fd, &msgs_[sent], unsigned(count_ - sent), 0);
    if (n > 0) {
      sent += std::size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && stalls++ < 100) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 10);
      continue;
    }
    // This datagram cannot be sent (peer unreachable, buffer full for too long): skip it.
    ++failed;
    ++sent;
  }
  send_errors_ += failed;
  std::size_t delivered = count_ - failed;
  count_ = 0;
  return delivered;
}

}  // namespace hysync
