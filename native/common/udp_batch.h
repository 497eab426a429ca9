// Batched UDP I/O (recvmmsg / sendmmsg) over buffers allocated once: no allocation per packet.
// One DatagramBatch is either a receive batch or a send batch, owned by one thread.
//
// A send batch on a UDP socket may segment (set_segmenting): each run of consecutive datagrams
// for one peer goes to the kernel as one message with UDP_SEGMENT (UDP GSO), which crosses the
// stack once and is split into the same datagrams at the end (the receiver sees no difference).
// Per datagram that saves the route lookup, the IP and device layers and the receiver's
// wake-up, which is most of what a small datagram costs on loopback.
//
// A receive batch may coalesce (set_coalescing, UDP GRO): the kernel then keeps such a run
// as one buffer up to the receiving socket (loopback always, a NIC with GRO too) instead of
// splitting it back into datagrams first, and says the segment size in a control message.
// receive() splits the buffers (split_received), so data(i), length(i) and peer(i) still
// index datagrams: a caller sees the same datagrams either way, in the order they were sent.
#pragma once
#include <linux/if_packet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <vector>
#include <system_error>

namespace hysync {

// One datagram of a received message: `length` bytes at `offset` in the message's buffer.
struct ReceivedDatagram {
  uint32_t offset, length, message;
  bool truncated;  // longer than the batch's max_bytes (or cut by the kernel): length is cut
};

// The datagrams of one received message of `len` bytes (recvmsg's byte count) with header
// `msg` (its control data and flags): one, or the run the kernel coalesced into it (UDP GRO):
// segments of the size its UDP_GRO control message gives, the last one possibly shorter.
// Appends them to `out`, marked as message `message`. A datagram longer than `max_bytes`
// is cut to it and flagged truncated, as is the last one when the kernel cut the message
// (MSG_TRUNC). Control data that no kernel writes (malformed, cut short, a segment size of
// 0, more than MAX_COALESCED segments) reads as one datagram, which fails any length check.
void split_received(const msghdr& msg, std::size_t len, std::size_t max_bytes, uint32_t message,
                    std::vector<ReceivedDatagram>& out);
// More segments than any kernel coalesces (UDP_GRO_CNT_MAX is 64; a GSO send carries at most
// UDP_MAX_SEGMENTS, 64 or 128).
inline constexpr std::size_t MAX_COALESCED = 256;
// The UDP_GRO segment size in a received message's control data; 0 when there is none (or it
// is malformed).
std::size_t coalesced_segment_size(const msghdr& msg);
// The SCM_TIMESTAMPNS arrival time in a received message's control data, in seconds of
// CLOCK_REALTIME; 0 when there is none (or it is malformed).
double received_timestamp(const msghdr& msg);

class DatagramBatch {
 public:
  // `capacity` datagrams of at most `max_bytes` each (a longer datagram arrives truncated and
  // flagged, see truncated()).
  explicit DatagramBatch(std::size_t capacity, std::size_t max_bytes = 2048);
  DatagramBatch(const DatagramBatch&) = delete;
  DatagramBatch& operator=(const DatagramBatch&) = delete;

  // Receive: fill the batch from `fd` with one recvmmsg (MSG_DONTWAIT unless `wait`) of up to
  // capacity() messages. Returns the number of datagrams received (0 when nothing is queued;
  // more than the messages when some were coalesced); throws std::system_error on a socket
  // error other than EAGAIN/EINTR.
  std::size_t receive(int fd, bool wait = false);
  // UDP sockets only, before the first receive(): enables UDP_GRO on `fd` and gives every
  // message a buffer for a whole coalesced run (64 KiB; the memory is reserved, and only what
  // arrives is touched). False when the kernel has no UDP GRO (before 5.0): one datagram per
  // message, as without this.
  bool set_coalescing(int fd);
  // Before the first receive(): the kernel stamps each message with when it arrived
  // (SO_TIMESTAMPNS, the real-time clock), read back by arrival(). False when the socket
  // refuses it: arrival() is then 0.
  bool set_timestamping(int fd);
  // When datagram i's message arrived, in seconds of CLOCK_REALTIME; 0 when not stamped.
  double arrival(std::size_t i) const {
    return timestamping_ ? arrivals_[received_[i].message] : 0;
  }
  // How many messages the last receive() read: capacity() says more may be queued.
  std::size_t messages() const { return messages_; }
  const uint8_t* data(std::size_t i) const {
    return &buffers_[received_[i].message * stride_ + received_[i].offset];
  }
  std::size_t length(std::size_t i) const { return received_[i].length; }
  bool truncated(std::size_t i) const { return received_[i].truncated; }
  const sockaddr_in& peer(std::size_t i) const {
    return *reinterpret_cast<const sockaddr_in*>(&addrs_[received_[i].message]);
  }
  // The sender of datagram i on an AF_PACKET socket (sll_pkttype says which way it went).
  const sockaddr_ll& link_peer(std::size_t i) const {
    return *reinterpret_cast<const sockaddr_ll*>(&addrs_[received_[i].message]);
  }
  // Send every received datagram back to its sender, as received (a reflector): no copy; a
  // coalesced run goes back as one segmented message where the batch segments. Returns how
  // many datagrams were sent, as flush() does.
  std::size_t echo(int fd);

  // Send: append() reserves the next datagram's buffer for `dst`; flush() sends all of them.
  // append() returns nullptr when the batch is full (flush first) or `len` > max_bytes.
  uint8_t* append(const sockaddr_in& dst, std::size_t len);
  // The same without an address, for a socket bound to its peer (an AF_PACKET interface).
  uint8_t* append(std::size_t len);
  // Sends every appended datagram (sendmmsg, retried on partial sends and EINTR; on EAGAIN it
  // polls for writability). Returns how many were sent; the rest are dropped and counted in
  // send_errors() (a full socket buffer or an unreachable peer must not stall the data path).
  std::size_t flush(int fd);
  // Drops every appended datagram unsent.
  void discard() { count_ = 0; }
  // Only for UDP sockets (not AF_PACKET). A kernel without UDP GSO (before 4.18, or a device
  // without checksum offload) refuses the first segmented message: the batch then sends
  // datagram by datagram from there on. Once one went through, a refused one is a failed send.
  void set_segmenting(bool on) { segmenting_ = on ? Segmenting::UNTRIED : Segmenting::OFF; }
  // Reorders the appended datagrams so that those for one peer are consecutive, each peer's
  // in the order appended: a receiver is woken once for its share of the batch, not once per
  // datagram, when a batch fans out to several peers (a multicast's replicas).
  void group_by_peer();

  // Datagrams appended (a send batch) or received by the last receive().
  std::size_t size() const { return count_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t max_bytes() const { return max_bytes_; }
  uint64_t send_errors() const { return send_errors_; }

 private:
  std::size_t capacity_, max_bytes_, count_ = 0, messages_ = 0;
  std::size_t stride_;  // bytes between two messages' buffers: max_bytes_, or a coalesced run's
  uint64_t send_errors_ = 0;
  enum class Segmenting { OFF, UNTRIED, WORKS } segmenting_ = Segmenting::OFF;
  bool coalescing_ = false, timestamping_ = false;
  std::vector<double> arrivals_;  // per message, with timestamping
  // Not value-initialized: a coalescing batch reserves 64 KiB a message, and only the pages
  // that datagrams land in become resident.
  std::unique_ptr<uint8_t[]> buffers_;
  std::vector<sockaddr_storage> addrs_;  // sockaddr_in (UDP) or sockaddr_ll (AF_PACKET)
  std::vector<iovec> iovs_;
  std::vector<mmsghdr> msgs_;
  std::vector<ReceivedDatagram> received_;
  // A coalescing or timestamping receive's control buffer per message, for the UDP_GRO segment
  // size and the arrival time (room for a few more control messages, so that one enabled
  // elsewhere does not cut them off).
  struct alignas(cmsghdr) ReceiveControl {
    char bytes[CMSG_SPACE(sizeof(int)) * 4 + CMSG_SPACE(sizeof(timespec))];
  };
  std::vector<ReceiveControl> rx_controls_;
  // echo() of a coalesced receive where segmenting is off: datagram by datagram.
  std::size_t echo_singly(int fd, std::size_t from_message);

  // Segmented sending: the runs of msgs_ as messages, each with its datagrams' iovecs copied
  // in order and a UDP_SEGMENT control message.
  struct alignas(cmsghdr) SegmentControl {
    char bytes[CMSG_SPACE(sizeof(uint16_t))];
  };
  std::size_t coalesce();
  // sendmmsg `n` messages from `msgs`, message k carrying weight[k] datagrams (all 1 when
  // weight is null), adding to `done` and `failed` in datagrams; stops at a segmented message
  // the kernel refuses. Returns the messages handled.
  std::size_t send(int fd, mmsghdr* msgs, std::size_t n, const uint32_t* weight,
                   std::size_t& done, std::size_t& failed);
  std::vector<mmsghdr> runs_;
  std::vector<iovec> run_iovs_;
  std::vector<uint32_t> run_sizes_;  // datagrams per run
  std::vector<SegmentControl> run_controls_;
  // msgs_[0..changed_) may differ from a receive's layout (the kernel wrote name lengths and
  // flags, or they were sent from): receive() resets only those, not the whole capacity.
  std::size_t changed_;
};

}  // namespace hysync
