// A non-blocking UDP socket bound to 127.0.0.1 on a free port, for the fuzz targets that
// drive real receive paths; aborts if the machine cannot give one.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>

namespace hysync::fuzz {

inline int loopback_udp_socket(sockaddr_in* bound) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::abort();
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (bound) *bound = a;
  return fd;
}

}  // namespace hysync::fuzz
