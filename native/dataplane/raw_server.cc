#include "dataplane/raw_server.h"

#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <system_error>

#include "common/udp_batch.h"
#include "dataplane/sockets.h"

namespace hysync::dataplane {

namespace {
constexpr std::size_t RX_BATCH = 32;
constexpr std::size_t TX_BATCH = 64;
constexpr std::size_t MAX_FRAME = 65536;  // a jumbo frame must not be truncated
}  // namespace

RawServer::RawServer(Pipeline& pipeline, const std::map<uint16_t, std::string>& ports,
                     const std::map<uint16_t, double>& delays_ms)
    : pipeline_(pipeline), shard_(pipeline.counters().add_shard()) {
  if (ports.empty()) throw std::invalid_argument("the raw data plane needs at least one PORT@IFACE");
  for (const auto& [port, ms] : delays_ms) {
    if (ms < 0)
      throw std::invalid_argument("port " + std::to_string(port) +
                                  ": a delay must be >= 0 ms, got " + std::to_string(ms));
    if (ms > 0)
      delays_[port] = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(ms));
  }
  try {
    for (const auto& [port, iface] : ports) {
      fds_[port] = open_raw(iface);
      tx_[port] = std::make_unique<DatagramBatch>(TX_BATCH, MAX_FRAME);
    }
  } catch (...) {
    for (const auto& [port, fd] : fds_) close(fd);
    throw;
  }
}

RawServer::~RawServer() {
  stop();
  for (const auto& [port, fd] : fds_) close(fd);
}

void RawServer::start() {
  ServingThreads::start(1, [this](std::size_t) { serve(); });
}

void RawServer::emit(uint16_t port, const uint8_t* frame, std::size_t len) {
  auto it = tx_.find(port);
  if (it == tx_.end()) {  // no interface is mapped to this port: nowhere to send
    unmapped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  DatagramBatch& tx = *it->second;
  uint8_t* buffer = tx.append(len);
  if (buffer == nullptr) {
    packets_out.fetch_add(tx.flush(fds_[port]), std::memory_order_relaxed);
    buffer = tx.append(len);
    if (buffer == nullptr) return;  // longer than any frame we receive: cannot happen
  }
  std::memcpy(buffer, frame, len);
}

void RawServer::send_due() {
  const auto now = Clock::now();
  while (!queue_.empty() && queue_.top().due <= now) {
    const Delayed& d = queue_.top();
    emit(d.port, d.frame.data(), d.frame.size());
    queue_.pop();
  }
}

int RawServer::poll_timeout_ms() const {
  if (queue_.empty()) return POLL_MS;
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(queue_.top().due - Clock::now());
  return int(std::max<int64_t>(0, std::min<int64_t>(POLL_MS, wait.count())));
}

void RawServer::serve() {
  std::vector<pollfd> polls;
  std::vector<uint16_t> port_of;
  for (const auto& [port, fd] : fds_) {
    polls.push_back({fd, POLLIN, 0});
    port_of.push_back(port);
  }
  DatagramBatch rx(RX_BATCH, MAX_FRAME);
  uint8_t scratch[MAX_OUT_FRAME];
  while (!stopping()) {
    int ready = poll(polls.data(), polls.size(), poll_timeout_ms());
    send_due();
    if (ready > 0) {
      auto guard = pipeline_.batch_guard();
      const Tables& tables = pipeline_.tables();
      auto sink = [&](uint16_t port, const uint8_t* frame, std::size_t len) {
        auto delay = delays_.find(port);
        if (delay == delays_.end()) return emit(port, frame, len);
        queue_.push({Clock::now() + delay->second, order_++, port,
                     std::vector<uint8_t>(frame, frame + len)});
      };
      for (std::size_t p = 0; p < polls.size(); ++p) {
        if (!(polls[p].revents & POLLIN)) continue;
        std::size_t n = 0;
        try {
          n = rx.receive(polls[p].fd);
        } catch (const std::system_error&) {  // e.g. ENETDOWN while a link is taken down
          continue;
        }
        for (std::size_t i = 0; i < n; ++i) {
          if (rx.link_peer(i).sll_pkttype == PACKET_OUTGOING) continue;  // left, not arrived
          packets_in.fetch_add(1, std::memory_order_relaxed);
          pipeline_.process_frame(shard_, tables, port_of[p], rx.data(i), rx.length(i), scratch,
                                  sink);
        }
      }
    }
    for (auto& [port, tx] : tx_)
      if (tx->size()) packets_out.fetch_add(tx->flush(fds_[port]), std::memory_order_relaxed);
  }
}

}  // namespace hysync::dataplane
