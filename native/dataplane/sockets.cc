#include "dataplane/sockets.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "hysync_wire.h"

namespace hysync::dataplane {

namespace {

constexpr int BUFFER_BYTES = 16 * 1024 * 1024;

// Past net.core.[rw]mem_max where root may (the *FORCE options), else as large as allowed: a
// burst from many workers' windows must fit, or it waits for their retransmission timeouts.
void big_buffers(int fd, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof(bytes)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

// The group's sockets take the datagrams of worker id w % n (the HySync header's byte, read by
// a classic BPF program on the UDP payload) rather than by the kernel's 4-tuple hash, which
// can put three of four workers on one socket and leave another thread idle. One worker still
// lands on one socket. Best effort: without it, the hash spreads them.
void steer_by_worker(int fd, std::size_t n) {
  sock_filter code[] = {
      {BPF_LD | BPF_B | BPF_ABS, 0, 0, wire::OFF_WORKER_ID},  // too short: returns 0
      {BPF_ALU | BPF_MOD | BPF_K, 0, 0, uint32_t(n)},
      {BPF_RET | BPF_A, 0, 0, 0},
  };
  sock_fprog program{sizeof(code) / sizeof(code[0]), code};
  setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &program, sizeof(program));
}

[[noreturn]] void fail(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), what + ": " + std::strerror(err));
}

}  // namespace

int open_udp(const std::string& host, uint16_t port, bool share_port) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    throw std::system_error(EINVAL, std::generic_category(),
                            "cannot bind UDP " + where + ": " + host +
                                " is not an IPv4 address or host name");
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  addr.sin_port = htons(port);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(errno, "cannot open a UDP socket");
  int one = 1;
  if (share_port) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  big_buffers(fd, BUFFER_BYTES);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    throw std::system_error(err, std::generic_category(),
                            "cannot bind UDP " + where + ": " +
                                std::strerror(err) + ". Pick a free port with --udp HOST:PORT.");
  }
  return fd;
}

uint16_t local_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

std::vector<int> open_udp_group(const std::string& host, uint16_t port, std::size_t n) {
  std::vector<int> fds;
  try {
    fds.push_back(open_udp(host, port, n > 1));
    while (fds.size() < n) fds.push_back(open_udp(host, local_port(fds[0]), true));
    if (n > 1) steer_by_worker(fds[0], n);
  } catch (...) {
    for (int fd : fds) close(fd);
    throw;
  }
  return fds;
}

int open_raw(const std::string& iface) {
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd < 0) {
    int err = errno;
    if (err == EPERM || err == EACCES)
      throw std::system_error(err, std::generic_category(),
                              "cannot open a raw socket for " + iface +
                                  ": the raw data plane needs root (CAP_NET_RAW); use --udp "
                                  "HOST:PORT otherwise");
    fail(err, "cannot open a raw socket for " + iface);
  }
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_protocol = htons(ETH_P_ALL);
  addr.sll_ifindex = int(if_nametoindex(iface.c_str()));
  if (addr.sll_ifindex == 0) {
    close(fd);
    throw std::system_error(ENODEV, std::generic_category(),
                            "interface " + iface +
                                " does not exist (create it, e.g. with Mininet, or fix the -i "
                                "PORT@IFACE map)");
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    fail(err, "cannot bind a raw socket to " + iface);
  }
  big_buffers(fd, 4 * 1024 * 1024);
  return fd;
}

}  // namespace hysync::dataplane
