// hysync._core.wire: the constants the core was compiled with, so Python can check that the
// built module agrees with hysync/wire.py (tests/native/test_wire_header.py).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/registry.h"
#include "hysync_wire.h"

namespace nb = nanobind;
namespace w = hysync::wire;

namespace {

void bind(nb::module_& m) {
  m.doc() = "Wire constants compiled into the core (generated from hysync/wire.py).";
  nb::dict c;
  c["VERSION"] = w::VERSION;
  c["HYSYNC_UDP_PORT"] = w::HYSYNC_UDP_PORT;
  c["LANES"] = w::LANES;
  c["MAX_WORKERS"] = w::MAX_WORKERS;
  c["MAX_JOBS"] = w::MAX_JOBS;
  c["NUM_SLOTS"] = w::NUM_SLOTS;
  c["NUM_DROP_REASONS"] = w::NUM_DROP_REASONS;
  c["FLOOD_MCAST_GROUP"] = w::FLOOD_MCAST_GROUP;
  c["HEADER_BYTES"] = w::HEADER_BYTES;
  c["PACKET_BYTES"] = w::PACKET_BYTES;
  c["HYSYNC_OFFSET"] = w::HYSYNC_OFFSET;
  m.attr("constants") = c;
  m.attr("header_offsets") = std::vector<std::pair<std::string, std::size_t>>{
      {"version", w::OFF_VERSION}, {"op", w::OFF_OP},         {"flags", w::OFF_FLAGS},
      {"mode", w::OFF_MODE},       {"job_id", w::OFF_JOB_ID}, {"worker_id", w::OFF_WORKER_ID},
      {"count", w::OFF_COUNT},     {"slot", w::OFF_SLOT},     {"reason", w::OFF_REASON},
      {"quorum", w::OFF_QUORUM},   {"round", w::OFF_ROUND},   {"chunk", w::OFF_CHUNK},
      {"bitmap", w::OFF_BITMAP}};
}

hysync::Binder binder("wire", bind);

}  // namespace
