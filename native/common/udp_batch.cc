#include "common/udp_batch.h"

#include <netinet/udp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace hysync {

namespace {
// A coalesced run is at most one UDP/IPv4 datagram's worth of payload.
constexpr std::size_t COALESCED_BYTES = 65536;
// What a receive of capacity() messages usually splits into at most (UDP_GRO_CNT_MAX): more
// grows the list once.
constexpr std::size_t USUAL_SEGMENTS = 64;
}  // namespace

namespace {

// The data of the first control message of `level` and `type` in a received message, and its
// length; nullptr when there is none. Walked by offsets, each header copied out, rather than
// with CMSG_NXTHDR: a length that no kernel writes must end the walk, not move a pointer out
// of the buffer.
const uint8_t* control_data(const msghdr& msg, int level, int type, std::size_t& data_len) {
  if (msg.msg_control == nullptr || (msg.msg_flags & MSG_CTRUNC)) return nullptr;
  const auto* base = static_cast<const uint8_t*>(msg.msg_control);
  const std::size_t total = msg.msg_controllen;
  std::size_t at = 0;
  while (total - at >= sizeof(cmsghdr)) {
    cmsghdr c;
    std::memcpy(&c, base + at, sizeof(c));
    if (c.cmsg_len < CMSG_LEN(0) || c.cmsg_len > total - at) return nullptr;
    if (c.cmsg_level == level && c.cmsg_type == type) {
      data_len = c.cmsg_len - CMSG_LEN(0);
      return base + at + CMSG_LEN(0);
    }
    const std::size_t step = CMSG_ALIGN(c.cmsg_len);
    if (step >= total - at) return nullptr;
    at += step;
  }
  return nullptr;
}

}  // namespace

double received_timestamp(const msghdr& msg) {
  std::size_t len = 0;
  const uint8_t* data = control_data(msg, SOL_SOCKET, SCM_TIMESTAMPNS, len);
  if (data == nullptr || len < sizeof(timespec)) return 0;
  timespec ts;
  std::memcpy(&ts, data, sizeof(ts));
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

std::size_t coalesced_segment_size(const msghdr& msg) {
  std::size_t data_len = 0;
  const uint8_t* data = control_data(msg, SOL_UDP, UDP_GRO, data_len);
  if (data == nullptr) return 0;
  // The kernel writes an int; accept the u16 that UDP_SEGMENT takes as well.
  if (data_len >= sizeof(int)) {
    int size;
    std::memcpy(&size, data, sizeof(size));
    return size > 0 ? std::size_t(size) : 0;
  }
  if (data_len >= sizeof(uint16_t)) {
    uint16_t size;
    std::memcpy(&size, data, sizeof(size));
    return size;
  }
  return 0;
}

void split_received(const msghdr& msg, std::size_t len, std::size_t max_bytes, uint32_t message,
                    std::vector<ReceivedDatagram>& out) {
  const bool cut = msg.msg_flags & MSG_TRUNC;
  std::size_t segment = coalesced_segment_size(msg);
  if (segment == 0 || segment >= len || (len - 1) / segment >= MAX_COALESCED) segment = len;
  std::size_t at = 0;
  do {  // a message of 0 bytes is one empty datagram
    const std::size_t n = std::min(segment, len - at);
    const bool last = at + n == len;
    out.push_back({uint32_t(at), uint32_t(std::min(n, max_bytes)), message,
                   n > max_bytes || (last && cut)});
    at += n;
  } while (at < len);
}

DatagramBatch::DatagramBatch(std::size_t capacity, std::size_t max_bytes)
    : capacity_(capacity),
      max_bytes_(max_bytes),
      stride_(max_bytes),
      buffers_(new uint8_t[capacity * max_bytes]),
      addrs_(capacity),
      iovs_(capacity),
      msgs_(capacity),
      runs_(capacity),
      run_iovs_(capacity),
      run_sizes_(capacity),
      run_controls_(capacity),
      changed_(capacity) {
  received_.reserve(capacity);
}

bool DatagramBatch::set_coalescing(int fd) {
  int on = 1;
  if (setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof(on)) != 0) return false;
  coalescing_ = true;
  stride_ = std::max(max_bytes_, COALESCED_BYTES);
  buffers_.reset(new uint8_t[capacity_ * stride_]);
  rx_controls_.resize(capacity_);
  received_.reserve(capacity_ * USUAL_SEGMENTS);
  changed_ = capacity_;
  return true;
}

bool DatagramBatch::set_timestamping(int fd) {
  int on = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)) != 0) return false;
  timestamping_ = true;
  rx_controls_.resize(capacity_);
  arrivals_.assign(capacity_, 0);
  changed_ = capacity_;
  return true;
}

std::size_t DatagramBatch::receive(int fd, bool wait) {
  for (std::size_t i = 0; i < changed_; ++i) {
    iovs_[i] = {&buffers_[i * stride_], stride_};
    std::memset(&msgs_[i], 0, sizeof(mmsghdr));
    msgs_[i].msg_hdr.msg_iov = &iovs_[i];
    msgs_[i].msg_hdr.msg_iovlen = 1;
    msgs_[i].msg_hdr.msg_name = &addrs_[i];
    msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
    if (coalescing_ || timestamping_) {
      msgs_[i].msg_hdr.msg_control = rx_controls_[i].bytes;
      msgs_[i].msg_hdr.msg_controllen = sizeof(ReceiveControl);
    }
  }
  changed_ = 0;
  received_.clear();
  for (;;) {
    int n = recvmmsg(fd, msgs_.data(), unsigned(capacity_), wait ? MSG_WAITFORONE : MSG_DONTWAIT,
                     nullptr);
    if (n >= 0) {
      messages_ = changed_ = std::size_t(n);
      for (std::size_t i = 0; i < messages_; ++i) {
        split_received(msgs_[i].msg_hdr, msgs_[i].msg_len, max_bytes_, uint32_t(i), received_);
        if (timestamping_) arrivals_[i] = received_timestamp(msgs_[i].msg_hdr);
      }
      count_ = received_.size();
      return count_;
    }
    if (errno == EINTR) continue;
    count_ = messages_ = 0;
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
  changed_ = std::max(changed_, count_);
  iovs_[i] = {&buffers_[i * stride_], len};
  std::memset(&msgs_[i], 0, sizeof(mmsghdr));
  msgs_[i].msg_hdr.msg_iov = &iovs_[i];
  msgs_[i].msg_hdr.msg_iovlen = 1;
  return &buffers_[i * stride_];
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
  if (count_ == messages_) {  // nothing was coalesced: a message is a datagram
    for (std::size_t i = 0; i < count_; ++i) {
      iovs_[i].iov_len = msgs_[i].msg_len;
      msgs_[i].msg_hdr.msg_flags = 0;
      msgs_[i].msg_hdr.msg_control = nullptr;  // the receive's, not a send's
      msgs_[i].msg_hdr.msg_controllen = 0;
    }
    return flush(fd);
  }
  // Each message back as it came: a coalesced run as one segmented message of its segments.
  std::size_t done = 0, failed = 0, sent_messages = 0;
  if (segmenting_ != Segmenting::OFF) {
    for (std::size_t m = 0, d = 0; m < messages_; ++m) {
      const std::size_t first = d;
      while (d < count_ && received_[d].message == m) ++d;
      mmsghdr& run = runs_[m];
      std::memset(&run, 0, sizeof(run));
      run.msg_hdr.msg_name = msgs_[m].msg_hdr.msg_name;
      run.msg_hdr.msg_namelen = msgs_[m].msg_hdr.msg_namelen;
      run_iovs_[m] = {&buffers_[m * stride_], msgs_[m].msg_len};
      run.msg_hdr.msg_iov = &run_iovs_[m];
      run.msg_hdr.msg_iovlen = 1;
      run_sizes_[m] = uint32_t(d - first);
      if (d - first > 1) {
        auto* c = reinterpret_cast<cmsghdr*>(run_controls_[m].bytes);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        const uint16_t segment = uint16_t(received_[first + 1].offset);
        std::memcpy(CMSG_DATA(c), &segment, sizeof(segment));
        run.msg_hdr.msg_control = c;
        run.msg_hdr.msg_controllen = sizeof(SegmentControl);
      }
    }
    sent_messages = send(fd, runs_.data(), messages_, run_sizes_.data(), done, failed);
    if (sent_messages < messages_) segmenting_ = Segmenting::OFF;
  }
  failed += echo_singly(fd, sent_messages);
  send_errors_ += failed;
  const std::size_t delivered = count_ - failed;
  count_ = 0;
  return delivered;
}

// The datagrams of messages [from_message, messages_) one sendto each; returns how many failed.
std::size_t DatagramBatch::echo_singly(int fd, std::size_t from_message) {
  std::size_t failed = 0;
  for (const ReceivedDatagram& d : received_) {
    if (d.message < from_message) continue;
    const msghdr& h = msgs_[d.message].msg_hdr;
    const uint8_t* data = &buffers_[d.message * stride_ + d.offset];
    ssize_t sent;
    do {
      sent = sendto(fd, data, d.length, 0, static_cast<const sockaddr*>(h.msg_name),
                    h.msg_namelen);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0) ++failed;
  }
  return failed;
}

std::size_t DatagramBatch::flush(int fd) {
  std::size_t done = 0, failed = 0;  // datagrams handed to the kernel or given up; given up
  if (segmenting_ != Segmenting::OFF && count_ > 1) {
    const std::size_t runs = coalesce();
    if (send(fd, runs_.data(), runs, run_sizes_.data(), done, failed) < runs)
      segmenting_ = Segmenting::OFF;  // no UDP GSO here: the rest, and later batches, one by one
  }
  if (done < count_) send(fd, &msgs_[done], count_ - done, nullptr, done, failed);
  send_errors_ += failed;
  const std::size_t delivered = count_ - failed;
  count_ = 0;
  return delivered;
}

namespace {

constexpr std::size_t MAX_SEGMENTS = 64;            // UDP_MAX_SEGMENTS (older kernels)
constexpr std::size_t MAX_SEGMENTED_BYTES = 65507;  // the payload of one UDP/IPv4 datagram

bool same_peer(const msghdr& a, const msghdr& b) {
  return a.msg_namelen == b.msg_namelen &&
         (a.msg_namelen == 0 || std::memcmp(a.msg_name, b.msg_name, a.msg_namelen) == 0);
}

// What a kernel or device without UDP GSO answers a segmented message.
bool segmenting_refused(int err) {
  return err == EIO || err == EINVAL || err == ENOPROTOOPT || err == EOPNOTSUPP;
}

}  // namespace

// The runs of msgs_: consecutive datagrams for one peer, all of the first one's size except a
// shorter last one (what UDP_SEGMENT can carry). Returns how many runs (runs_[0..n)).
std::size_t DatagramBatch::coalesce() {
  std::size_t n = 0;
  for (std::size_t i = 0; i < count_; ++n) {
    const msghdr& head = msgs_[i].msg_hdr;
    const std::size_t size = head.msg_iov->iov_len;
    std::size_t j = i, bytes = 0;
    while (j < count_ && j - i < MAX_SEGMENTS && same_peer(msgs_[j].msg_hdr, head)) {
      const std::size_t len = msgs_[j].msg_hdr.msg_iov->iov_len;
      if (j > i && (len > size || bytes + len > MAX_SEGMENTED_BYTES)) break;
      run_iovs_[j] = *msgs_[j].msg_hdr.msg_iov;
      bytes += len;
      ++j;
      if (len < size || size == 0) break;
    }
    mmsghdr& run = runs_[n];
    std::memset(&run, 0, sizeof(run));
    run.msg_hdr.msg_name = head.msg_name;
    run.msg_hdr.msg_namelen = head.msg_namelen;
    run.msg_hdr.msg_iov = &run_iovs_[i];
    run.msg_hdr.msg_iovlen = j - i;
    run_sizes_[n] = uint32_t(j - i);
    if (j - i > 1) {
      auto* c = reinterpret_cast<cmsghdr*>(run_controls_[n].bytes);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const uint16_t segment = uint16_t(size);
      std::memcpy(CMSG_DATA(c), &segment, sizeof(segment));
      run.msg_hdr.msg_control = c;
      run.msg_hdr.msg_controllen = sizeof(SegmentControl);
    }
    i = j;
  }
  return n;
}

// sendmmsg, retried on partial sends and EINTR; on EAGAIN it polls for writability. A message
// that cannot be sent (peer unreachable, buffer full for too long) is dropped and counted in
// `failed`: a full socket buffer must not stall the data path. Returns the messages handled;
// fewer than `n` only when the kernel refuses the first segmented message it is offered (it has
// no UDP GSO), which stays unsent.
std::size_t DatagramBatch::send(int fd, mmsghdr* msgs, std::size_t n, const uint32_t* weight,
                                std::size_t& done, std::size_t& failed) {
  auto datagrams = [weight](std::size_t k) -> std::size_t { return weight ? weight[k] : 1; };
  std::size_t k = 0;
  int stalls = 0;
  while (k < n) {
    const int sent = sendmmsg(fd, &msgs[k], unsigned(n - k), 0);
    if (sent > 0) {
      for (int m = 0; m < sent; ++m) {
        if (datagrams(k) > 1) segmenting_ = Segmenting::WORKS;
        done += datagrams(k++);
      }
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && stalls++ < 100) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 10);
      continue;
    }
    if (sent < 0 && datagrams(k) > 1 && segmenting_ == Segmenting::UNTRIED &&
        segmenting_refused(errno))
      return k;
    failed += datagrams(k);
    done += datagrams(k++);
  }
  return k;
}

}  // namespace hysync
