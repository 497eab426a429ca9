// Opening the data plane's sockets, with errors that say what to do.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <system_error>

namespace hysync::dataplane {

// A non-blocking UDP socket bound to host:port (port 0: any free port) with large buffers.
// `share_port`: SO_REUSEPORT, so that several threads' sockets share the address and the
// kernel spreads senders over them (one sender always lands on one socket).
// Throws std::system_error naming the address and the fix.
int open_udp(const std::string& host, uint16_t port, bool share_port);
uint16_t local_port(int fd);
// `n` such sockets sharing one address (the first picks the port when `port` is 0); socket i
// receives the datagrams of HySync worker ids i, i + n, ... (any one sender's on one socket).
std::vector<int> open_udp_group(const std::string& host, uint16_t port, std::size_t n);

// A non-blocking AF_PACKET socket bound to `iface` for every protocol. Throws
// std::system_error naming the interface (and root, when that is what is missing).
int open_raw(const std::string& iface);

}  // namespace hysync::dataplane
