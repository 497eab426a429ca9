// hysync._core.dataplane: the native softswitch data plane for Python
// (softswitch/native.py wraps it in the reference Pipeline's interface).
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <system_error>

#include "common/registry.h"
#include "dataplane/pipeline.h"
#include "dataplane/raw_server.h"
#include "dataplane/reflector.h"
#include "dataplane/udp_server.h"

namespace nb = nanobind;
using namespace hysync::dataplane;
namespace w = hysync::wire;

namespace {

using MemberRow = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;
using JobRow = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
using ModeRow = std::tuple<uint32_t, int64_t, uint32_t, uint32_t, uint32_t, uint32_t>;
using L2Row = std::pair<uint64_t, uint16_t>;
using RewriteRow = std::tuple<uint32_t, uint64_t, uint32_t, uint16_t>;
using GroupRow = std::pair<uint32_t, std::vector<std::pair<uint16_t, uint32_t>>>;
// job, level, spine address, spine MAC, uplink id, leaf address (softswitch/levels.py JobRole)
using RoleRow = std::tuple<uint32_t, uint32_t, uint32_t, uint64_t, uint32_t, uint32_t>;

// The pipeline plus the counter shard that calls from Python (tests, the bench) count in.
struct Engine {
  explicit Engine(uint32_t num_slots) : pipeline(num_slots), caller(pipeline.counters().add_shard()) {}
  Pipeline pipeline;
  CounterShard& caller;
  std::mutex caller_mu;
  uint8_t scratch[MAX_OUT_FRAME];
};

std::shared_ptr<const Tables> build_tables(const std::vector<MemberRow>& members,
                                           const std::vector<JobRow>& jobs,
                                           const std::vector<ModeRow>& modes,
                                           const std::vector<L2Row>& l2,
                                           const std::vector<RewriteRow>& rewrites,
                                           const std::vector<GroupRow>& groups,
                                           const std::vector<RoleRow>& roles) {
  auto t = std::make_shared<Tables>();
  for (const auto& [job, worker, ip, port] : members)
    t->members.insert(MemberKey{uint16_t(job), uint8_t(worker), ip, uint16_t(port)});
  for (const auto& [job, base, count, n, group, epoch] : jobs)
    t->jobs[job] = JobConfig{base, count, n, group, epoch};
  for (const auto& [job, priority, lo, hi, mode, quorum] : modes)
    t->modes[job].push_back(ModeRange{-priority, lo, hi, mode, quorum});
  for (auto& [job, rows] : t->modes) std::sort(rows.begin(), rows.end());
  for (const auto& [mac, port] : l2) t->l2[mac] = port;
  std::unordered_map<uint32_t, Rewrite> by_rid;
  for (const auto& [rid, mac, ip, port] : rewrites) by_rid[rid] = Rewrite{mac, ip, port};
  for (const auto& [gid, replicas] : groups) {
    auto& out = t->groups[gid];
    for (const auto& [port, rid] : replicas) {
      auto rw = by_rid.find(rid);
      out.push_back(Replica{port, rid, rw != by_rid.end(), rw != by_rid.end() ? rw->second : Rewrite{}});
    }
  }
  for (const auto& [job, level, spine_addr, spine_mac, uplink_id, leaf_addr] : roles) {
    if (level > uint32_t(Level::SPINE) || uplink_id >= w::MAX_WORKERS)
      throw std::invalid_argument("job " + std::to_string(job) + ": level " +
                                  std::to_string(level) + ", uplink id " +
                                  std::to_string(uplink_id) +
                                  " is not a role: levels are 0..2, uplink ids 0..31");
    if (level != uint32_t(Level::SINGLE))
      t->roles[job] = JobRole{Level(level), spine_addr, spine_mac, uint8_t(uplink_id), leaf_addr};
  }
  return t;
}

void check_counter(int id, uint32_t start, uint32_t stop) {
  if (id < 0 || id >= NUM_COUNTERS) throw std::out_of_range("no counter with id " + std::to_string(id));
  if (start > stop || stop > counter_size(id))
    throw std::out_of_range("counter cells [" + std::to_string(start) + ", " + std::to_string(stop) +
                            ") are outside the counter's " + std::to_string(counter_size(id)));
}

template <class Server>
void bind_serving(nb::class_<Server>& cls) {
  cls.def("stop", &Server::stop, nb::call_guard<nb::gil_scoped_release>(),
          "Stop the threads (returns when they have).")
      .def_prop_ro("packets_in", [](const Server& s) { return s.packets_in.load(); })
      .def_prop_ro("packets_out", [](const Server& s) { return s.packets_out.load(); })
      .def_prop_ro("send_errors", [](const Server& s) { return s.send_errors.load(); });
}

void bind(nb::module_& m) {
  m.doc() = "The softswitch's data plane (docs/protocol.md §4-§7) and its I/O, in C++.";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::system_error& e) {
      // what() is "<message>: <strerror>"; the messages thrown here already say what failed
      // and how to fix it, so the strerror suffix goes.
      std::string message = e.what();
      const std::string suffix = ": " + e.code().message();
      if (message.size() > suffix.size() &&
          message.compare(message.size() - suffix.size(), suffix.size(), suffix) == 0)
        message.resize(message.size() - suffix.size());
      PyErr_SetObject(PyExc_OSError, nb::make_tuple(e.code().value(), message).ptr());
    }
  });
  m.attr("COUNTERS") = int(NUM_COUNTERS);

  nb::class_<Engine>(m, "Pipeline", "Registers, tables and counters; any number of threads.")
      .def(nb::init<uint32_t>(), nb::arg("num_slots") = w::NUM_SLOTS)
      .def_prop_ro("num_slots", [](const Engine& e) { return e.pipeline.num_slots(); })
      .def(
          "set_tables",
          [](Engine& e, const std::vector<MemberRow>& members, const std::vector<JobRow>& jobs,
             const std::vector<ModeRow>& modes, const std::vector<L2Row>& l2,
             const std::vector<RewriteRow>& rewrites, const std::vector<GroupRow>& groups,
             const std::vector<RoleRow>& roles) {
            auto tables = build_tables(members, jobs, modes, l2, rewrites, groups, roles);
            nb::gil_scoped_release release;
            e.pipeline.set_tables(std::move(tables));
          },
          nb::arg("members"), nb::arg("jobs"), nb::arg("modes"), nb::arg("l2"),
          nb::arg("rewrites"), nb::arg("groups"), nb::arg("roles") = std::vector<RoleRow>{},
          "Swap in a whole new snapshot of the tables, groups and jobs' roles, between two "
          "packet batches.")
      .def(
          "read_register",
          [](Engine& e, const std::string& name, std::size_t index) {
            return e.pipeline.read_register(name, index);
          },
          nb::arg("name"), nb::arg("index"),
          "One register cell by the reference model's name: by slot, or for member_seq and "
          "member_epoch by slot * MAX_WORKERS + worker.")
      .def(
          "write_member_register",
          [](Engine& e, const std::string& name, std::size_t index, uint32_t value) {
            e.pipeline.write_member_register(name, index, value);
          },
          nb::arg("name"), nb::arg("index"), nb::arg("value"),
          "member_seq or member_epoch at slot * MAX_WORKERS + worker, as a P4Runtime "
          "register write sets it.")
      .def("reset_registers", [](Engine& e) { e.pipeline.reset_registers(); },
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "read_counter",
          [](Engine& e, int id, uint32_t start, uint32_t stop) {
            check_counter(id, start, stop);
            std::vector<uint64_t> packets, bytes;
            e.pipeline.counters().read(id, start, stop, packets, bytes);
            return std::make_pair(packets, bytes);
          },
          nb::arg("counter"), nb::arg("start"), nb::arg("stop"))
      .def(
          "write_counter",
          [](Engine& e, int id, uint32_t start, uint32_t stop,
             std::optional<std::vector<uint64_t>> packets,
             std::optional<std::vector<uint64_t>> bytes) {
            check_counter(id, start, stop);
            for (const auto* v : {&packets, &bytes})
              if (*v && (*v)->size() != stop - start)
                throw std::invalid_argument("write_counter needs one value per cell");
            e.pipeline.counters().write(id, start, stop, packets ? packets->data() : nullptr,
                                        bytes ? bytes->data() : nullptr);
          },
          nb::arg("counter"), nb::arg("start"), nb::arg("stop"), nb::arg("packets").none(),
          nb::arg("bytes").none())
      .def("clear_counter", [](Engine& e, int id) {
        check_counter(id, 0, 0);
        e.pipeline.counters().clear(id);
      })
      .def(
          "process_datagram",
          [](Engine& e, uint32_t src_ip, uint16_t src_port, nb::bytes payload) {
            nb::list out;
            std::lock_guard<std::mutex> lock(e.caller_mu);
            auto guard = e.pipeline.batch_guard();
            e.pipeline.process_datagram(
                e.caller, e.pipeline.tables(), src_ip, src_port,
                reinterpret_cast<const uint8_t*>(payload.c_str()), payload.size(), e.scratch,
                [&](uint32_t ip, uint16_t port, const uint8_t* data, std::size_t len) {
                  out.append(nb::make_tuple(ip, port, nb::bytes(data, len)));
                });
            return out;
          },
          nb::arg("src_ip"), nb::arg("src_port"), nb::arg("payload"),
          "A datagram on the HySync UDP port -> [(dst_ip, dst_port, datagram)].")
      .def(
          "process_frame",
          [](Engine& e, uint16_t port, nb::bytes frame) {
            nb::list out;
            std::lock_guard<std::mutex> lock(e.caller_mu);
            auto guard = e.pipeline.batch_guard();
            e.pipeline.process_frame(e.caller, e.pipeline.tables(), port,
                                     reinterpret_cast<const uint8_t*>(frame.c_str()),
                                     frame.size(), e.scratch,
                                     [&](uint16_t egress, const uint8_t* data, std::size_t len) {
                                       out.append(nb::make_tuple(egress, nb::bytes(data, len)));
                                     });
            return out;
          },
          nb::arg("ingress_port"), nb::arg("frame"),
          "One Ethernet frame in -> [(egress port, frame)].");

  nb::class_<UdpServer> udp(m, "UdpServer", "The UDP data plane: SO_REUSEPORT sockets, a thread each.");
  udp.def(
         "__init__",
         [](UdpServer* self, Engine& e, const std::string& host, uint16_t port, std::size_t threads) {
           new (self) UdpServer(e.pipeline, host, port, threads);
         },
         nb::arg("pipeline"), nb::arg("host"), nb::arg("port"), nb::arg("threads"),
         nb::keep_alive<1, 2>())
      .def_prop_ro("port", &UdpServer::port)
      .def("start", &UdpServer::start);
  bind_serving(udp);

  nb::class_<RawServer> raw(m, "RawServer", "The raw-interface data plane: AF_PACKET sockets.");
  raw.def(
         "__init__",
         [](RawServer* self, Engine& e, const std::map<uint16_t, std::string>& ports,
            const std::map<uint16_t, double>& delays_ms) {
           new (self) RawServer(e.pipeline, ports, delays_ms);
         },
         nb::arg("pipeline"), nb::arg("ports"), nb::arg("delays_ms"), nb::keep_alive<1, 2>())
      .def("start", &RawServer::start)
      .def_prop_ro("unmapped", &RawServer::unmapped);
  bind_serving(raw);

  nb::enum_<Answer>(m, "Answer", "What a Reflector answers a datagram with.")
      .value("ECHO", Answer::ECHO, "the datagram itself: the machine's UDP limit")
      .value("AS_RESULT", Answer::AS_RESULT,
             "a contribution's own result: the zero-work switch for one worker");
  nb::class_<Reflector> reflector(m, "Reflector",
                                  "The zero-work server, batched: ECHO or AS_RESULT.");
  reflector.def(nb::init<const std::string&, uint16_t, std::size_t, Answer>(), nb::arg("host"),
                nb::arg("port"), nb::arg("threads"), nb::arg("answer") = Answer::ECHO)
      .def_prop_ro("port", &Reflector::port)
      .def("start", &Reflector::start);
  bind_serving(reflector);
}

hysync::Binder binder("dataplane", bind);

}  // namespace
