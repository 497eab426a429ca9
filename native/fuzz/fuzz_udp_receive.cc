// Fuzz target: the coalesced receive path (native/common/udp_batch.*). Each input is read two
// ways. First as one received message: the first bytes give its length, flags (MSG_TRUNC,
// MSG_CTRUNC) and the batch's max_bytes, the rest is its control data, which split_received
// must read without stepping outside it; an input whose first byte is odd gets a well-formed
// UDP_GRO control message in front (segment size from the input), so the splitting itself is
// reached, not only the control walk. The datagrams it yields must tile the message. Then,
// every few inputs, for real over loopback: the input's bytes go out as one UDP GSO message
// (segment size from the input, the last segment shorter where it falls so) to a coalescing
// DatagramBatch, which must hand back exactly the datagrams that were sent, and echo them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/udp_batch.h"
#include "fuzz/loopback_socket.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_udp_receive: %s\n", what);
  std::abort();
}

// The parser on a synthetic message header.
void check_split(const uint8_t* data, size_t size) {
  if (size < 4) return;
  const std::size_t len = (std::size_t(data[0]) << 8 | data[1]) % 65537;
  const int flags = (data[2] & 1 ? MSG_TRUNC : 0) | (data[2] & 2 ? MSG_CTRUNC : 0);
  const std::size_t max_bytes = data[3] & 1 ? 2048 : 1 + std::size_t(data[3]) * 9;
  std::vector<uint8_t> control;
  if (data[0] & 1 && size >= 6) {  // a UDP_GRO control message, then whatever follows
    control.resize(CMSG_SPACE(sizeof(int)));
    cmsghdr c{};
    c.cmsg_len = CMSG_LEN(sizeof(int));
    c.cmsg_level = SOL_UDP;
    c.cmsg_type = UDP_GRO;
    std::memcpy(control.data(), &c, sizeof(c));
    const int segment = int(uint32_t(data[4]) << 8 | data[5]) - (data[2] & 4 ? 1024 : 0);
    std::memcpy(control.data() + CMSG_LEN(0), &segment, sizeof(segment));
    control.insert(control.end(), data + 6, data + size);
  } else {
    control.assign(data + 4, data + size);
  }
  // The control buffer as the kernel would see it: aligned for cmsghdr, exactly this long.
  std::vector<cmsghdr> aligned(control.size() / sizeof(cmsghdr) + 1);
  if (!control.empty()) std::memcpy(aligned.data(), control.data(), control.size());
  msghdr msg{};
  msg.msg_control = control.empty() ? nullptr : aligned.data();
  msg.msg_controllen = control.size();
  msg.msg_flags = flags;
  std::vector<hysync::ReceivedDatagram> out;
  hysync::split_received(msg, len, max_bytes, 7, out);
  if (out.empty()) fail("no datagram from a message");
  if (out.size() > hysync::MAX_COALESCED) fail("more datagrams than any kernel coalesces");
  std::size_t at = 0;
  for (const auto& d : out) {
    if (d.message != 7) fail("wrong message index");
    if (d.offset != at) fail("datagrams do not tile the message");
    if (d.length > max_bytes) fail("a datagram longer than max_bytes");
    if (d.offset + d.length > len) fail("a datagram past the message's end");
    // the next one starts a whole segment on: the segment is the first datagram's extent
    const std::size_t extent = out.size() == 1 ? len : out[1].offset;
    at += extent;
  }
  if (out.size() > 1 && out.back().offset >= len) fail("an empty last segment");
  if (out.size() == 1 && out[0].length != (len < max_bytes ? len : max_bytes))
    fail("one datagram of the wrong length");
}

using hysync::fuzz::loopback_udp_socket;

struct Loopback {
  sockaddr_in to{}, from{};
  int receiver = loopback_udp_socket(&to), sender = loopback_udp_socket(&from);
  hysync::DatagramBatch batch{8, 512};
  bool coalescing = batch.set_coalescing(receiver);
  Loopback() { batch.set_segmenting(true); }
};

// The real path: one GSO message of the input, received and split by a coalescing batch.
void check_loopback(const uint8_t* data, size_t size) {
  static Loopback* lo = new Loopback();
  if (size < 3) return;
  const std::size_t segment = 1 + (std::size_t(data[0]) << 8 | data[1]) % 600;
  const uint8_t* payload = data + 2;
  const std::size_t len = size - 2;
  const std::size_t segments = (len + segment - 1) / segment;
  if (segments > 64) return;  // UDP_MAX_SEGMENTS on older kernels: the send would fail
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(uint16_t))] = {};
  msghdr msg{};
  iovec iov{const_cast<uint8_t*>(payload), len};
  msg.msg_name = &lo->to;
  msg.msg_namelen = sizeof(lo->to);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (segments > 1) {
    auto* c = reinterpret_cast<cmsghdr*>(control);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    const uint16_t s = uint16_t(segment);
    std::memcpy(CMSG_DATA(c), &s, sizeof(s));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  if (sendmsg(lo->sender, &msg, 0) != ssize_t(len)) return;  // no UDP GSO here: nothing to check
  pollfd p{lo->receiver, POLLIN, 0};
  if (poll(&p, 1, 1000) != 1) fail("a loopback datagram did not arrive");
  std::size_t got = 0;
  while (got < segments) {
    const std::size_t n = lo->batch.receive(lo->receiver);
    if (n == 0 && poll(&p, 1, 1000) != 1) fail("segments missing");
    for (std::size_t i = 0; i < n; ++i, ++got) {
      const std::size_t at = got * segment, want = len - at < segment ? len - at : segment;
      if (got >= segments) fail("more datagrams than were sent");
      const std::size_t kept = want < 512 ? want : 512;
      if (lo->batch.length(i) != kept || lo->batch.truncated(i) != (want > 512))
        fail("a received datagram of the wrong length");
      if (std::memcmp(lo->batch.data(i), payload + at, kept) != 0)
        fail("a received datagram with the wrong bytes");
      if (lo->batch.peer(i).sin_port != lo->from.sin_port) fail("the wrong sender");
    }
    if (n && lo->batch.echo(lo->receiver) != n) fail("echo sent fewer than received");
  }
  uint8_t sink[65536];  // the echoes, back at the sender
  while (recv(lo->sender, sink, sizeof sink, 0) >= 0) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t inputs = 0;
  check_split(data, size);
  if (++inputs % 8 == 0) check_loopback(data, size);
  return 0;
}
