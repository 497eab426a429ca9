// hysync._core.worker: the transport engine and the quantizer, for worker/transport.py and
// worker/quantize.py. Buffers cross as numpy arrays without copies; calls that wait on the
// network release the GIL for their whole duration.
#include <arpa/inet.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <stdexcept>

#include "common/registry.h"
#include "worker/engine.h"
#include "worker/quantize.h"

namespace nb = nanobind;
using namespace nb::literals;
using hysync::worker::Engine;
using hysync::worker::EngineConfig;

namespace {

using Floats = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FloatsOut = nb::ndarray<nb::numpy, float, nb::ndim<1>, nb::c_contig>;

// Set when the interpreter starts to exit (worker/api.py hooks it into threading's exit
// callbacks): every call in flight returns at its next check instead of waiting on peers
// that are gone, so Python joins the threads that run them before it finalizes. A thread
// still inside a call at finalization would take the GIL back there, which ends the thread
// by unwinding through a noexcept frame: std::terminate, SIGABRT at exit. Read without
// the GIL.
std::atomic<bool> abandoning{false};

std::tuple<uint64_t, uint64_t, float> quantize(Floats values, Floats fixed, Floats error,
                                               double scale, int members) {
  if (fixed.shape(0) != values.shape(0) || error.shape(0) != values.shape(0))
    throw std::invalid_argument("quantize: values, fixed and error must have the same length");
  hysync::worker::Quantizer q(scale, members);
  hysync::worker::QuantStats stats;
  {
    nb::gil_scoped_release unlocked;
    q.quantize(values.data(), fixed.data(), error.data(), values.shape(0), stats);
  }
  return {stats.clipped, stats.nonfinite, stats.max_abs_error};
}

Engine* make_engine(Engine* self, int fd, uint32_t job_id, uint32_t worker_id,
                    const std::string& switch_ip, uint16_t switch_port, uint32_t slot_base,
                    uint32_t slot_count, int members, double scale, double rto_initial,
                    double rto_min, double rto_max, double dead_after, double stall_after,
                    double missed_after, double join_after, float staleness_decay,
                    uint64_t seed, bool test_only_ignore_echo, bool test_only_no_chase,
                    bool test_only_pin_overflow, bool test_only_no_restart_detection,
                    bool test_only_no_flight_deadline, bool test_only_send_dropped) {
  EngineConfig c;
  c.job_id = job_id;
  c.worker_id = worker_id;
  c.switch_addr.sin_family = AF_INET;
  c.switch_addr.sin_port = htons(switch_port);
  if (inet_pton(AF_INET, switch_ip.c_str(), &c.switch_addr.sin_addr) != 1)
    throw std::invalid_argument("switch address " + switch_ip + " is not a dotted IPv4 address");
  c.slot_base = slot_base;
  c.slot_count = slot_count;
  c.members = members;
  c.scale = scale;
  c.rto_initial = rto_initial;
  c.rto_min = rto_min;
  c.rto_max = rto_max;
  c.dead_after = dead_after;
  c.stall_after = stall_after;
  c.missed_after = missed_after;
  c.join_after = join_after;
  c.staleness_decay = staleness_decay;
  c.seed = seed;
  c.test_only_ignore_echo = test_only_ignore_echo;
  c.test_only_no_chase = test_only_no_chase;
  c.test_only_pin_overflow = test_only_pin_overflow;
  c.test_only_no_restart_detection = test_only_no_restart_detection;
  c.test_only_no_flight_deadline = test_only_no_flight_deadline;
  c.test_only_send_dropped = test_only_send_dropped;
  Engine* engine = new (self) Engine(c, fd);
  engine->set_interrupt_check([] {  // Ctrl-C in the main thread; elsewhere it never fires
    if (abandoning.load(std::memory_order_relaxed)) return true;  // no GIL: we may be exiting
    nb::gil_scoped_acquire locked;
    return PyErr_CheckSignals() != 0;
  });
  return engine;
}

// A status of the engine's -> True (done), False (unreachable), or the pending exception.
bool finished(hysync::worker::CallStatus status) {
  if (status == hysync::worker::CallStatus::INTERRUPTED) {
    if (abandoning.load()) throw std::runtime_error("the process is exiting: HySync call abandoned");
    throw nb::python_error();
  }
  return status == hysync::worker::CallStatus::DONE;
}

int checked_key(Engine& e, int index) {
  if (index < 0 || index >= e.key_count())
    throw std::out_of_range("no key with index " + std::to_string(index));
  return index;
}

// The call's counters; its results' headers are handed over without a copy (the engine starts
// a new list).
nb::dict stats_of(Engine& e) {
  auto& s = e.stats();
  nb::dict d;
  d["included"] = s.included;
  d["carried"] = s.carried;
  d["residual_contribs"] = s.residual_contribs;
  d["null_contribs"] = s.null_contribs;
  d["own_applied"] = s.own_applied;
  d["retransmits"] = s.retransmits;
  d["parked"] = s.parked;
  d["parked_missed"] = s.parked_missed;
  d["acks"] = s.acks;
  d["duplicate_results"] = s.duplicate_results;
  d["stray_replies"] = s.stray_replies;
  d["bad_datagrams"] = s.bad_datagrams;
  d["joins"] = s.joins;
  d["uneven_results"] = s.uneven_results;
  d["resent"] = s.resent;
  d["waited_s"] = s.waited_s;
  d["absorbed"] = s.absorbed;
  d["resyncs"] = std::vector<uint64_t>(std::begin(s.resyncs), std::end(s.resyncs));
  d["quant"] = std::make_tuple(s.quant.elements, s.quant.clipped, s.quant.nonfinite,
                               s.quant.max_abs_error);
  auto* results = new std::vector<uint8_t>(std::move(s.results));
  nb::capsule owner(results, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  d["results"] = nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(results->data(), {results->size()},
                                                               owner);
  return d;
}

void bind(nb::module_& m) {
  m.doc() = "The worker's transport engine (docs/protocol.md §9) and its quantizer.";
  // A process may exit with a worker alive (an executor thread, a test that never closes it):
  // nanobind's exit-time leak report would then only be noise.
  nb::set_leak_warnings(false);
  m.def("abandon_calls", [] { abandoning.store(true); },
        "Make every call in flight, and every later one, end with RuntimeError (process exit).");
  m.def("quantize", &quantize, "values"_a, "fixed"_a, "error"_a, "scale"_a, "members"_a,
        "float32 values -> fixed (integers in float32) and error, in place; returns "
        "(clipped, nonfinite, max_abs_error).");
  m.def("quantizer_limits", [](int members) {
          if (members < 1 || members > 32)
            throw std::invalid_argument("quantizer_limits: members must be 1..32");
          const hysync::worker::Quantizer q(1.0, members);
          return std::make_tuple(q.sentinel(), q.bound());
        }, "members"_a,
        "(sentinel, bound) of the quantizer for `members` contributors: what a non-finite or "
        "out-of-range element is sent as, and the largest magnitude sent as itself.");
  nb::class_<Engine>(m, "Engine")
      .def("__init__", &make_engine, "fd"_a, "job_id"_a, "worker_id"_a, "switch_ip"_a,
           "switch_port"_a, "slot_base"_a, "slot_count"_a, "members"_a, "scale"_a,
           "rto_initial"_a, "rto_min"_a, "rto_max"_a, "dead_after"_a, "stall_after"_a,
           "missed_after"_a, "join_after"_a, "staleness_decay"_a, "seed"_a,
           "test_only_ignore_echo"_a = false, "test_only_no_chase"_a = false,
           "test_only_pin_overflow"_a = false, "test_only_no_restart_detection"_a = false,
           "test_only_no_flight_deadline"_a = false, "test_only_send_dropped"_a = false)
      .def("register", &Engine::register_key, "numel"_a)
      .def("retire", [](Engine& e, int k) { e.retire_key(checked_key(e, k)); }, "index"_a)
      .def("first_chunk", [](Engine& e, int k) { return e.key(checked_key(e, k)).first; })
      .def("residual", [](nb::handle_t<Engine> self, int k) {
             Engine& e = nb::cast<Engine&>(self);
             auto& res = e.key(checked_key(e, k)).residual;
             return FloatsOut(res.data(), {res.size()}, self);  // a view kept alive by self
           })
      .def("allreduce", [](Engine& e, int k, Floats values) {
             checked_key(e, k);
             if (int64_t(values.shape(0)) != e.key(k).numel)
               throw std::invalid_argument("allreduce: values do not match the key's size");
             hysync::worker::CallStatus status;
             {
               nb::gil_scoped_release unlocked;
               status = e.allreduce(k, values.data(), int64_t(values.shape(0)));
             }
             return finished(status);
           }, "index"_a, "values"_a,
           "Contribute values (float32, written over with the output); False: unreachable.")
      .def("take", [](Engine& e, int k, Floats out) {
             checked_key(e, k);
             if (int64_t(out.shape(0)) != e.key(k).numel)
               throw std::invalid_argument("take: out does not match the key's size");
             e.take(k, out.data());
           }, "index"_a, "out"_a)
      .def("give_residual", [](Engine& e, int k, Floats values) {
             if (int64_t(values.shape(0)) != e.key(checked_key(e, k)).numel)
               throw std::invalid_argument("give_residual: values do not match the key's size");
             e.give_residual(k, values.data());
           }, "index"_a, "values"_a, "Add values (float32, the key's size) into its residual.")
      .def("export_residual", [](Engine& e, int k, Floats out) {
             if (int64_t(out.shape(0)) != e.key(checked_key(e, k)).numel)
               throw std::invalid_argument("export_residual: out does not match the key's size");
             e.export_residual(k, out.data());
           }, "index"_a, "out"_a, "Move the key's residual into out (float32, the key's size).")
      .def("poll", [](Engine& e, double duration) {
             hysync::worker::CallStatus status;
             {
               nb::gil_scoped_release unlocked;
               status = e.poll(duration);
             }
             finished(status);
           }, "duration"_a)
      .def_prop_ro("reset_why", &Engine::reset_why,
                   "Why the last call aborted on new switch state, or ''.")
      // The in-memory backend (fd -1), for a deterministic driver (tests/sim): no socket, no
      // wall clock. begin_call keeps a pointer into `values`: the caller keeps the array alive
      // and untouched until step() returns something other than 3 (PENDING).
      .def("set_time", &Engine::set_time, "now"_a)
      .def("take_sent", [](Engine& e) {
             nb::list out;
             for (const auto& d : e.take_sent())
               out.append(nb::bytes(reinterpret_cast<const char*>(d.data()), d.size()));
             return out;
           })
      .def("begin_call", [](Engine& e, int k, Floats values) {
             checked_key(e, k);
             if (int64_t(values.shape(0)) != e.key(k).numel)
               throw std::invalid_argument("begin_call: values do not match the key's size");
             if (!e.call_done())
               throw std::runtime_error("begin_call: a call is under way");
             e.begin_call(k, values.data(), int64_t(values.shape(0)));
           }, "index"_a, "values"_a)
      .def("step", [](Engine& e, double now) { return int(e.step(now)); }, "now"_a,
           "One turn of the call's loop: 0 DONE, 1 UNREACHABLE, 3 PENDING, 4 RESET.")
      .def("next_wake", &Engine::next_wake)
      .def("on_datagram", [](Engine& e, nb::bytes data, double now) {
             e.on_datagram(reinterpret_cast<const uint8_t*>(data.c_str()), data.size(), now);
           }, "data"_a, "now"_a)
      .def("tick", &Engine::tick, "now"_a)
      .def("flights", [](const Engine& e) {
             // (slot index, datagram, amount it took from the residual or None), per flight
             nb::list out;
             for (uint32_t i = 0; i < e.window(); ++i) {
               const auto* f = e.flight(i);
               if (!f) continue;
               nb::object amount = nb::none();
               if (f->has_amount)
                 amount = nb::cast(std::vector<float>(f->amount.begin(), f->amount.end()));
               out.append(nb::make_tuple(
                   i, nb::bytes(reinterpret_cast<const char*>(f->data.data()), f->data.size()),
                   amount));
             }
             return out;
           })
      .def("stats", &stats_of)
      .def("absorbed", [](Engine& e) { return e.stats().absorbed; },
           "chunk * 64 + lane of every sentinel absorbed since the stats were reset (a copy)")
      .def("reset_stats", &Engine::reset_stats)
      .def_prop_ro("needs_resync", &Engine::needs_resync)
      .def("clear_resync", &Engine::clear_resync)
      .def_prop_ro("missed_results", &Engine::missed_results)
      .def_prop_ro("bad_datagrams", &Engine::bad_datagrams)
      .def_prop_ro("in_flight", &Engine::in_flight)
      .def_prop_ro("srtt", [](const Engine& e) -> nb::object {
             if (e.srtt() < 0) return nb::none();
             return nb::float_(e.srtt());
           })
      .def_prop_ro("rto", &Engine::rto)
      .def("slot_modes", &Engine::slot_modes)
      .def("describe_flights", &Engine::describe_flights)
      .def("take_logs", &Engine::take_logs);
}

hysync::Binder binder("worker", bind);

}  // namespace
