#include "dataplane/udp_server.h"

#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "common/udp_batch.h"
#include "dataplane/sockets.h"

namespace hysync::dataplane {

namespace {
constexpr std::size_t RX_BATCH = 64;
constexpr std::size_t TX_BATCH = 256;  // a batch of results multicast to a few members each
constexpr std::size_t MAX_DATAGRAM = 2048;  // longer ones arrive cut and fail the length check
}  // namespace

UdpServer::UdpServer(Pipeline& pipeline, const std::string& host, uint16_t port,
                     std::size_t threads)
    : pipeline_(pipeline) {
  fds_ = open_udp_group(host, port, threads == 0 ? 1 : threads);
  port_ = local_port(fds_[0]);
  for (std::size_t i = 0; i < fds_.size(); ++i) shards_.push_back(&pipeline_.counters().add_shard());
}

UdpServer::~UdpServer() {
  stop();
  for (int fd : fds_) close(fd);
}

void UdpServer::start() {
  ServingThreads::start(fds_.size(), [this](std::size_t i) { serve(i); });
}

void UdpServer::serve(std::size_t index) {
  const int fd = fds_[index];
  CounterShard& shard = *shards_[index];
  DatagramBatch rx(RX_BATCH, MAX_DATAGRAM), tx(TX_BATCH, wire::PACKET_BYTES);
  rx.set_coalescing(fd);  // a worker's GSO run arrives as one buffer: one wake-up, one copy
  tx.set_segmenting(true);
  uint8_t scratch[wire::PACKET_BYTES];
  pollfd readable{fd, POLLIN, 0};
  uint64_t sent_errors_seen = 0;
  while (!stopping()) {
    std::size_t n = rx.receive(fd);
    if (n == 0) {
      poll(&readable, 1, POLL_MS);
      continue;
    }
    std::size_t out = 0;
    {
      auto guard = pipeline_.batch_guard();
      const Tables& tables = pipeline_.tables();
      auto sink = [&](uint32_t ip, uint16_t port, const uint8_t* data, std::size_t len) {
        sockaddr_in dst{};
        dst.sin_family = AF_INET;
        dst.sin_addr.s_addr = htonl(ip);
        dst.sin_port = htons(port);
        uint8_t* buffer = tx.append(dst, len);
        if (buffer == nullptr) {
          tx.group_by_peer();
          out += tx.flush(fd);
          buffer = tx.append(dst, len);
        }
        std::memcpy(buffer, data, len);
      };
      for (std::size_t i = 0; i < n; ++i) {
        const sockaddr_in& peer = rx.peer(i);
        pipeline_.process_datagram(shard, tables, ntohl(peer.sin_addr.s_addr),
                                   ntohs(peer.sin_port), rx.data(i), rx.length(i), scratch, sink);
      }
    }
    tx.group_by_peer();
    out += tx.flush(fd);
    packets_in.fetch_add(n, std::memory_order_relaxed);
    packets_out.fetch_add(out, std::memory_order_relaxed);
    if (tx.send_errors() != sent_errors_seen) {
      send_errors.fetch_add(tx.send_errors() - sent_errors_seen, std::memory_order_relaxed);
      sent_errors_seen = tx.send_errors();
    }
  }
}

}  // namespace hysync::dataplane
