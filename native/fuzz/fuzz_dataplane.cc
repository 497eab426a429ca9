// Fuzz target: the native data plane's parsers and state machine (native/dataplane/).
// An input whose first byte is odd is shaped into a plausible contribution first (version,
// op, job, worker, slot, round and chunk in the ranges the tables below admit), so coverage
// reaches aggregation, closes, resends and stale rounds, not just the parser's early drops.
// Every input then runs twice: as a UDP datagram from an admitted member's address (the worker
// byte picks which), and inside an Ethernet/IPv4/UDP frame to the HySync port; the raw input
// also runs as a frame by itself. One pipeline lives across inputs, so rounds open, close,
// go stale and switch modes as the inputs accumulate. Jobs 4 and 5 run two levels
// (docs/protocol.md §11): a leaf whose spine is the members' own address, so that RESULTs and
// RESYNCs from it are verdicts, and a spine.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/bytes.h"
#include "dataplane/pipeline.h"
#include "hysync_wire.h"

namespace dp = hysync::dataplane;
namespace w = hysync::wire;

namespace {

constexpr uint32_t MEMBER_IP = 0x0A000001;  // 10.0.0.1
constexpr uint16_t BASE_PORT = 5000;

std::shared_ptr<const dp::Tables> fuzz_tables() {
  auto t = std::make_shared<dp::Tables>();
  for (uint16_t job = 1; job <= 5; ++job) {
    for (uint8_t wk = 0; wk < 5; ++wk) {
      t->members.insert(dp::MemberKey{job, wk, MEMBER_IP, uint16_t(BASE_PORT + wk)});
      uint32_t rid = uint32_t(job) * w::MAX_WORKERS + wk + 1;
      t->groups[job].push_back(dp::Replica{uint16_t(wk + 1), rid, wk != 4,
                                           dp::Rewrite{0x020000000000ull + wk, MEMBER_IP,
                                                       uint16_t(BASE_PORT + wk)}});
    }
    // job 1: sync over 4 of 5; job 2: partial(2) on half its slots; job 3: async.
    t->jobs[job] = dp::JobConfig{job <= 3 ? uint32_t(job - 1) * 4 : 8, 6, 4, job, 1};
  }
  t->roles[4] = dp::JobRole{dp::Level::LEAF, MEMBER_IP, 0x0A0000000002ull, 1, 0x0A000064};
  t->roles[5] = dp::JobRole{dp::Level::SPINE, 0, 0, 0, 0};
  t->modes[2].push_back(dp::ModeRange{-1, 4, 5, uint32_t(w::Mode::PARTIAL), 2});
  t->modes[3].push_back(dp::ModeRange{-1, 0, 100, uint32_t(w::Mode::ASYNC), 0});
  t->l2[0x0A0000000002ull] = 2;
  for (uint16_t port = 1; port <= 5; ++port)
    t->groups[w::FLOOD_MCAST_GROUP].push_back(dp::Replica{port, 0, false, {}});
  return t;
}

volatile uint8_t sink_byte;  // outputs are read, so ASan checks every byte the sinks see

void consume(const uint8_t* data, std::size_t len) {
  uint8_t x = 0;
  for (std::size_t i = 0; i < len; ++i) x ^= data[i];
  sink_byte = x;
}

// A contribution with fields in the admitted ranges, lanes from the input; cut or padded
// when the selector says so.
std::vector<uint8_t>& shaped(uint8_t selector, const uint8_t* data, std::size_t size) {
  static std::vector<uint8_t> packet;
  auto byte = [&](std::size_t i) -> uint8_t { return size ? data[i % size] : 0; };
  packet.assign(w::PACKET_BYTES, 0);
  for (std::size_t i = 0; i < packet.size(); ++i) packet[i] = byte(i + 7);
  packet[w::OFF_VERSION] = selector & 2 ? byte(0) : w::VERSION;
  packet[w::OFF_OP] = selector & 4 ? byte(1) % 6 : uint8_t(w::Op::CONTRIB);
  hysync::store_be16(&packet[w::OFF_JOB_ID], uint16_t(1 + byte(2) % 5));
  packet[w::OFF_WORKER_ID] = byte(3) % 6;
  hysync::store_be16(&packet[w::OFF_SLOT], uint16_t(byte(4) % 16));
  hysync::store_be32(&packet[w::OFF_ROUND], uint32_t(byte(5) % 5) - 1);
  hysync::store_be32(&packet[w::OFF_CHUNK], byte(6) % 2);
  if (selector & 8) packet.resize(byte(7) % (w::PACKET_BYTES + 40));
  return packet;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && (data[0] & 1)) {
    std::vector<uint8_t>& packet = shaped(data[0], data + 1, size - 1);
    data = packet.data();
    size = packet.size();
  }
  static dp::Pipeline pipeline(16);
  static dp::CounterShard& shard = [] () -> dp::CounterShard& {
    pipeline.set_tables(fuzz_tables());
    return pipeline.counters().add_shard();
  }();
  static std::vector<uint8_t> scratch(dp::MAX_OUT_FRAME), frame;
  auto guard = pipeline.batch_guard();
  const dp::Tables& tables = pipeline.tables();
  auto udp_sink = [](uint32_t, uint16_t, const uint8_t* out, std::size_t len) { consume(out, len); };
  auto frame_sink = [](uint16_t, const uint8_t* out, std::size_t len) { consume(out, len); };

  const uint16_t worker = size > w::OFF_WORKER_ID ? data[w::OFF_WORKER_ID] : 0;
  pipeline.process_datagram(shard, tables, MEMBER_IP, uint16_t(BASE_PORT + worker), data, size,
                            scratch.data(), udp_sink);

  // The same bytes as the payload of a well-formed frame from that member, then as a frame.
  frame.assign(w::HYSYNC_OFFSET, 0);
  hysync::store_be16(&frame[0], 0x0A00);
  hysync::store_be32(&frame[2], 0x00000002);
  hysync::store_be16(&frame[12], w::ETHERTYPE_IPV4);
  frame[14] = 0x45;
  hysync::store_be16(&frame[16], uint16_t(w::IPV4_BYTES + w::UDP_BYTES + size));
  frame[22] = 64;
  frame[23] = w::IPPROTO_UDP;
  hysync::store_be32(&frame[26], MEMBER_IP);
  hysync::store_be32(&frame[30], 0x0A000064);
  hysync::store_be16(&frame[34], uint16_t(BASE_PORT + worker));
  hysync::store_be16(&frame[36], w::HYSYNC_UDP_PORT);
  hysync::store_be16(&frame[38], uint16_t(w::UDP_BYTES + size));
  frame.insert(frame.end(), data, data + size);
  pipeline.process_frame(shard, tables, 1, frame.data(), frame.size(), scratch.data(), frame_sink);
  pipeline.process_frame(shard, tables, uint16_t(size % 6), data, size, scratch.data(),
                         frame_sink);
  return 0;
}
