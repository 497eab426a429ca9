// Fuzz target: the worker engine's receive path. Each input is one datagram, handed to an engine
// that is in the middle of a call (job 1, worker 0, slots 0..3, two keys), as its receive loop
// hands what recvmmsg returns. Now and then timers run (retransmissions, parking, STALE grace
// periods) and finished calls end and new ones begin, so that datagrams meet every state.
// Whatever arrives must be counted or acted on, never crash, leak or break the engine's books.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "worker/engine.h"
#include "fuzz/loopback_socket.h"

namespace hw = hysync::worker;

namespace {

using hysync::fuzz::loopback_udp_socket;

struct Harness {
  sockaddr_in sink_addr{};
  // the "switch": what the engine sends lands here, unread
  int sink = loopback_udp_socket(&sink_addr);
  int fd = loopback_udp_socket(nullptr);
  hw::Engine engine;
  int keys[2];
  std::vector<float> values[2];
  int turn = 0;
  uint64_t inputs = 0;

  static hw::EngineConfig config(const sockaddr_in& sw) {
    hw::EngineConfig c;
    c.job_id = 1;
    c.worker_id = 0;
    c.switch_addr = sw;
    c.slot_base = 0;
    c.slot_count = 4;
    c.members = 2;
    c.rto_initial = c.rto_min = 0.002;
    c.stall_after = 0.001;
    c.seed = 1;
    return c;
  }
  Harness()
      : engine(config(sink_addr), std::make_unique<hw::SocketBackend>(fd, sink_addr)) {
    keys[0] = engine.key_of("a", 300);  // chunks 0..4, the last one partial
    keys[1] = engine.key_of("b", 64);   // chunk 5
    begin();
  }
  void begin() {
    const int k = turn++ % 2;
    values[k].assign(std::size_t(engine.key(keys[k]).numel), 0.25f * float(turn % 7) - 0.5f);
    engine.begin_call(keys[k], values[k].data(), int64_t(values[k].size()));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();  // one engine across inputs: state builds up
  const double now = hw::monotonic_now();
  h->engine.on_datagram(data, size, now, now);
  if (++h->inputs % 16 == 0) h->engine.tick(now + 0.01 * double(h->inputs % 64));
  if (h->engine.call_done()) {
    h->engine.end_call();
    h->engine.reset_stats();  // a call's results list would otherwise grow across inputs
    if (h->inputs % 5 == 0) h->engine.clear_resync();
    h->begin();
  }
  if (h->engine.in_flight() < 0 || h->engine.in_flight() > 4) std::abort();
  return 0;
}
