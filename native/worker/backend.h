// The engine's I/O: where its datagrams go and come from, and its clock. The engine runs the
// same code over either backend; only these calls differ.
//   SocketBackend: a UDP socket to the switch (sendmmsg / recvmmsg batches, GSO runs, the
//     kernel's receive timestamps), the monotonic clock, ppoll for waits. What
//     worker/transport.py uses.
//   MemoryBackend: no socket and no wall clock, for a deterministic driver (tests/sim, the
//     retransmission tests): the driver sets the time, takes what was sent and hands replies
//     to Engine::on_datagram.
#pragma once
#include <netinet/in.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/udp_batch.h"

namespace hysync::worker {

double monotonic_now();

// Where a backend hands the datagrams it reads (the engine's receive path): `now` is when it
// is read, `arrived` when it reached the worker (the socket's receive timestamp), earlier
// when it waited in the socket's buffer while the worker computed.
class DatagramSink {
 public:
  virtual void on_datagram(const uint8_t* data, std::size_t size, double now, double arrived) = 0;

 protected:
  ~DatagramSink() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual double now() const = 0;
  // Queue one datagram (`size` bytes) for the switch; flush() sends what is queued.
  virtual void send(const uint8_t* data, std::size_t size) = 0;
  virtual void flush() = 0;
  // Drop what is queued and not yet sent (an abort forgets the flights it belongs to).
  virtual void discard() = 0;
  // Read one batch of waiting datagrams into `sink`, without blocking. Returns the number of
  // messages read; a full batch (RECEIVE_BATCH) means more may wait. A socket error (e.g. an
  // ICMP error reported on the socket) throws std::system_error.
  virtual std::size_t receive(DatagramSink& sink) = 0;
  // Block until a datagram may be read or `timeout` seconds pass; true: one may be read.
  // Returns at once, false, once the backend is closed.
  virtual bool wait(double timeout) = 0;
  // From any thread: every later use of the backend is refused (closed() turns true) and a
  // wait in progress returns at once. The engine then ends its call (CallStatus::CLOSED)
  // without another look at its socket, so that the socket's owner may close it as soon as
  // the call has returned, never under it.
  void close() {
    closed_.store(true, std::memory_order_release);
    wake();
  }
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Messages read per receive() at most (a coalesced GSO run counts as one).
  static constexpr std::size_t RECEIVE_BATCH = 256;

 protected:
  // Make a wait in progress in another thread return (close()).
  virtual void wake() {}

 private:
  std::atomic<bool> closed_{false};
};

class SocketBackend final : public Backend {
 public:
  // fd: a bound UDP socket (the caller owns it); `to`: the switch's data-plane address.
  SocketBackend(int fd, const sockaddr_in& to);
  ~SocketBackend() override;
  SocketBackend(const SocketBackend&) = delete;
  SocketBackend& operator=(const SocketBackend&) = delete;
  double now() const override { return monotonic_now(); }
  void send(const uint8_t* data, std::size_t size) override;
  void flush() override;
  void discard() override { tx_.discard(); }
  std::size_t receive(DatagramSink& sink) override;
  bool wait(double timeout) override;

 private:
  void wake() override;

  int fd_;
  // An eventfd that close() makes readable, for good: a wait polls it beside fd_.
  int wake_fd_;
  sockaddr_in to_;
  DatagramBatch rx_, tx_;
};

class MemoryBackend final : public Backend {
 public:
  double now() const override { return now_; }
  void set_time(double now) { now_ = now; }
  void send(const uint8_t* data, std::size_t size) override {
    sent_.emplace_back(data, data + size);
  }
  void flush() override {}
  // What the driver has not taken yet is not sent.
  void discard() override { sent_.clear(); }
  // Nothing arrives on its own: the driver calls Engine::on_datagram.
  std::size_t receive(DatagramSink&) override { return 0; }
  // Nothing can arrive while the engine blocks: the wait passes its whole timeout.
  bool wait(double timeout) override {
    if (closed()) return false;
    now_ += timeout;
    return false;
  }
  // The datagrams sent since the last take.
  std::vector<std::vector<uint8_t>> take_sent() {
    std::vector<std::vector<uint8_t>> out;
    out.swap(sent_);
    return out;
  }

 private:
  double now_ = 0;
  std::vector<std::vector<uint8_t>> sent_;
};

}  // namespace hysync::worker
