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
#include <memory>
#include <string>
#include <stdexcept>

#include "common/registry.h"
#include "worker/engine.h"
#include "worker/quantize.h"

namespace nb = nanobind;
using namespace nb::literals;
using hysync::worker::Engine;
using hysync::worker::EngineConfig;
using hysync::worker::Faults;

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

// fd >= 0: a bound UDP socket (the socket backend); -1: the in-memory backend, the only one
// that takes faults.
Engine* make_engine(Engine* self, const EngineConfig& config, int fd, const Faults* faults) {
  std::unique_ptr<hysync::worker::Backend> backend;
  if (fd >= 0) {
    if (faults != nullptr)
      throw std::invalid_argument("Engine: faults are for the in-memory backend (fd=-1) only");
    backend = std::make_unique<hysync::worker::SocketBackend>(fd, config.switch_addr);
  } else {
    backend = std::make_unique<hysync::worker::MemoryBackend>();
  }
  Engine* engine = new (self) Engine(config, std::move(backend), faults ? *faults : Faults{});
  engine->set_interrupt_check([] {  // Ctrl-C in the main thread; elsewhere it never fires
    if (abandoning.load(std::memory_order_relaxed)) return true;  // no GIL: we may be exiting
    nb::gil_scoped_acquire locked;
    return PyErr_CheckSignals() != 0;
  });
  return engine;
}

std::string switch_ip(const EngineConfig& c) {
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &c.switch_addr.sin_addr, text, sizeof text);
  return text;
}

void set_switch_ip(EngineConfig& c, const std::string& ip) {
  c.switch_addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, ip.c_str(), &c.switch_addr.sin_addr) != 1)
    throw std::invalid_argument("switch address " + ip + " is not a dotted IPv4 address");
}

// EngineConfig and Faults as Python classes, made with the C++ defaults; every field an
// attribute (worker/config.py's engine_config sets them by name).
void bind_config(nb::module_& m) {
  nb::class_<EngineConfig>(m, "EngineConfig",
                           "The worker engine's configuration; its defaults are the worker's.")
      .def(nb::init<>())
      .def_rw("job_id", &EngineConfig::job_id)
      .def_rw("worker_id", &EngineConfig::worker_id)
      .def_prop_rw("switch_ip", &switch_ip, &set_switch_ip)
      .def_prop_rw(
          "switch_port", [](const EngineConfig& c) { return ntohs(c.switch_addr.sin_port); },
          [](EngineConfig& c, uint16_t port) {
            c.switch_addr.sin_family = AF_INET;
            c.switch_addr.sin_port = htons(port);
          })
      .def_rw("slot_base", &EngineConfig::slot_base)
      .def_rw("slot_count", &EngineConfig::slot_count)
      .def_rw("members", &EngineConfig::members)
      .def_rw("scale", &EngineConfig::scale)
      .def_rw("rto_initial", &EngineConfig::rto_initial)
      .def_rw("rto_min", &EngineConfig::rto_min)
      .def_rw("rto_max", &EngineConfig::rto_max)
      .def_rw("dead_after", &EngineConfig::dead_after)
      .def_rw("stall_after", &EngineConfig::stall_after)
      .def_rw("missed_after", &EngineConfig::missed_after)
      .def_rw("join_after", &EngineConfig::join_after)
      .def_rw("staleness_decay", &EngineConfig::staleness_decay)
      .def_rw("seed", &EngineConfig::seed)
      .def_rw("behind_leaf", &EngineConfig::behind_leaf)
      .def_prop_rw(
          "install_tag", [](const EngineConfig& c) { return c.install_tag; },
          [](EngineConfig& c, int tag) {
            if (tag < -1 || tag > 255)
              throw std::invalid_argument(
                  "install_tag " + std::to_string(tag) +
                  " is invalid: give the low byte of the job's install epoch (0..255), or -1 "
                  "when it is unknown");
            c.install_tag = tag;
          });
  nb::class_<Faults>(m, "Faults",
                     "Protocol rules a simulation takes out (native/worker/faults.h).")
      .def(nb::init<>())
      .def_rw("ignore_echo", &Faults::ignore_echo)
      .def_rw("no_chase", &Faults::no_chase)
      .def_rw("fixed_order", &Faults::fixed_order)
      .def_rw("order_at_start", &Faults::order_at_start)
      .def_rw("no_reoffer", &Faults::no_reoffer)
      .def_rw("carry_held_at_start", &Faults::carry_held_at_start)
      .def_rw("join_behind_waits", &Faults::join_behind_waits)
      .def_rw("join_left_out_waits", &Faults::join_left_out_waits)
      .def_rw("join_left_out_any_call", &Faults::join_left_out_any_call)
      .def_rw("refused_reoffer_is_progress", &Faults::refused_reoffer_is_progress)
      .def_rw("progress_from_any_flight", &Faults::progress_from_any_flight)
      .def_rw("unreachable_after_any_give_up", &Faults::unreachable_after_any_give_up)
      .def_rw("ack_leaves_no_suspect", &Faults::ack_leaves_no_suspect)
      .def_rw("async_floor_unread", &Faults::async_floor_unread)
      .def_rw("async_answer_unread", &Faults::async_answer_unread)
      .def_rw("my_other_copy_settles", &Faults::my_other_copy_settles)
      .def_rw("refused_mark_unread", &Faults::refused_mark_unread)
      .def_rw("probe_period_by_difference", &Faults::probe_period_by_difference)
      .def_rw("forgotten_round_unread", &Faults::forgotten_round_unread)
      .def_rw("hurry_into_async", &Faults::hurry_into_async)
      .def_rw("forget_rounds_of_tag_left", &Faults::forget_rounds_of_tag_left)
      .def_rw("acked_sync_leaves_no_twin", &Faults::acked_sync_leaves_no_twin)
      .def_rw("park_keeps_unlearned_rto", &Faults::park_keeps_unlearned_rto)
      .def_rw("unlearned_park_backs_off_heard", &Faults::unlearned_park_backs_off_heard)
      .def_rw("held_result_samples_rtt", &Faults::held_result_samples_rtt)
      .def_rw("one_tag_left", &Faults::one_tag_left)
      .def_rw("closed_by_my_other_waits_rto", &Faults::closed_by_my_other_waits_rto)
      .def_rw("state_left_teaches_rounds", &Faults::state_left_teaches_rounds)
      .def_rw("launch_past_sync_copy", &Faults::launch_past_sync_copy)
      .def_rw("hold_past_copy_by_rto", &Faults::hold_past_copy_by_rto)
      .def_rw("flight_deadline_from_launch", &Faults::flight_deadline_from_launch)
      .def_rw("everyone_heard_in_resend", &Faults::everyone_heard_in_resend)
      .def_rw("pin_overflow", &Faults::pin_overflow)
      .def_rw("no_restart_detection", &Faults::no_restart_detection)
      .def_rw("no_flight_deadline", &Faults::no_flight_deadline)
      .def_rw("own_flight_deadline", &Faults::own_flight_deadline)
      .def_rw("parked_flight_no_deadline", &Faults::parked_flight_no_deadline)
      .def_rw("send_dropped", &Faults::send_dropped)
      .def_rw("read_time_window", &Faults::read_time_window)
      .def_rw("forget_counted_at_reset", &Faults::forget_counted_at_reset)
      .def_rw("ignore_relayed", &Faults::ignore_relayed)
      .def_rw("no_step_back", &Faults::no_step_back)
      .def_rw("leaf_verdict_waits", &Faults::leaf_verdict_waits);
}

// A status of the engine's -> True (done), False (unreachable, reset or closed: the caller
// tells them apart by reset_why and closed), or the pending exception.
bool finished(hysync::worker::CallStatus status) {
  if (status == hysync::worker::CallStatus::INTERRUPTED) {
    if (abandoning.load()) throw std::runtime_error("the process is exiting: HySync call abandoned");
    throw nb::python_error();
  }
  return status == hysync::worker::CallStatus::DONE;
}

// The in-memory backend of an engine made with fd -1, for the calls only it answers.
hysync::worker::MemoryBackend& memory_of(Engine& e, const char* what) {
  auto* memory = dynamic_cast<hysync::worker::MemoryBackend*>(&e.backend());
  if (memory == nullptr)
    throw std::logic_error(std::string(what) + ": this engine runs on a socket; make it with "
                           "fd=-1 for the in-memory backend");
  return *memory;
}

// The live key named `name`: KeyError names the fix if none.
int known_key(Engine& e, const std::string& name) {
  const int index = e.find_key(name);
  if (index < 0)
    throw nb::key_error(("no key '" + name + "': register it, or make a call under it, first")
                            .c_str());
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
  d["state_resets"] = s.state_resets;
  d["relayed"] = s.relayed;
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
  bind_config(m);
  nb::class_<Engine>(m, "Engine")
      .def("__init__", &make_engine, "config"_a, "fd"_a = -1, "faults"_a.none() = nb::none(),
           "An engine on the socket fd (bound UDP), or with fd=-1 on the in-memory backend.")
      // A key is its name (a str), from the caller to the wire (native/worker/keys.h); the
      // engine keeps each key's residual under it from call to call.
      .def("register", [](Engine& e, const std::string& key, int64_t numel) {
             e.key_of(key, numel);
           }, "key"_a, "numel"_a,
           "Give `key` its chunk range for numel elements now (a call under it does otherwise).")
      .def("first_chunk", [](Engine& e, const std::string& key) {
             return e.key(known_key(e, key)).first;
           }, "key"_a)
      .def("size", [](Engine& e, const std::string& key) { return e.key(known_key(e, key)).numel; },
           "key"_a)
      .def("residual", [](nb::handle_t<Engine> self, const std::string& key) {
             Engine& e = nb::cast<Engine&>(self);
             auto& res = e.key(known_key(e, key)).residual;
             return FloatsOut(res.data(), {res.size()}, self);  // a view kept alive by self
           }, "key"_a,
           "The residual the engine keeps for `key`: a writable view, padded to whole chunks "
           "(read or restore it between calls only).")
      .def("allreduce", [](Engine& e, const std::string& key, Floats values) {
             const int k = e.key_of(key, int64_t(values.shape(0)));
             hysync::worker::CallStatus status;
             {
               nb::gil_scoped_release unlocked;
               status = e.allreduce(k, values.data(), int64_t(values.shape(0)));
             }
             return finished(status);
           }, "key"_a, "values"_a,
           "Contribute values (float32, written over with the output) under `key`, with the "
           "residual the engine keeps for it; False: unreachable.")
      .def("take", [](Engine& e, const std::string& key, Floats out) {
             const int k = known_key(e, key);
             if (int64_t(out.shape(0)) != e.key(k).numel)
               throw std::invalid_argument("take: out does not match the key's size");
             e.take(k, out.data());
           }, "key"_a, "out"_a)
      .def("poll", [](Engine& e, double duration) {
             hysync::worker::CallStatus status;
             {
               nb::gil_scoped_release unlocked;
               status = e.poll(duration);
             }
             finished(status);
           }, "duration"_a)
      // Not under the GIL's release: it only sets a flag and wakes the call's wait, which runs
      // in another thread without the GIL.
      .def("close", &Engine::close,
           "End the call or poll in progress at once (aborted, as a failed call) and refuse "
           "every later one; the socket is not touched again. Any thread.")
      .def_prop_ro("closed", &Engine::closed)
      .def_prop_ro("reset_why", &Engine::reset_why,
                   "Why the last call aborted on new switch state, or ''.")
      // The in-memory backend (fd -1), for a deterministic driver (tests/sim): no socket, no
      // wall clock. begin_call keeps a pointer into `values`: the caller keeps the array alive
      // and untouched until step() returns something other than 3 (PENDING).
      .def("set_time", [](Engine& e, double now) { memory_of(e, "set_time").set_time(now); },
           "now"_a)
      .def("take_sent", [](Engine& e) {
             nb::list out;
             for (const auto& d : memory_of(e, "take_sent").take_sent())
               out.append(nb::bytes(reinterpret_cast<const char*>(d.data()), d.size()));
             return out;
           })
      .def("begin_call", [](Engine& e, const std::string& key, Floats values) {
             if (!e.call_done())
               throw std::runtime_error("begin_call: a call is under way");
             const int k = e.key_of(key, int64_t(values.shape(0)));
             e.begin_call(k, values.data(), int64_t(values.shape(0)));
           }, "key"_a, "values"_a)
      .def("step", [](Engine& e, double now) { return int(e.step(now)); }, "now"_a,
           "One turn of the call's loop: 0 DONE, 1 UNREACHABLE, 3 PENDING, 4 RESET.")
      .def("next_wake", &Engine::next_wake)
      .def("on_datagram", [](Engine& e, nb::bytes data, double now, double arrived) {
             e.on_datagram(reinterpret_cast<const uint8_t*>(data.c_str()), data.size(), now,
                           arrived < 0 ? now : arrived);
           }, "data"_a, "now"_a, "arrived"_a = -1.0,
           "Hand the engine a datagram read at `now` that arrived at `arrived` (default: now).")
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
      .def("parked", [](const Engine& e) {
             // (slot index, chunk) of each flight parked (docs/protocol.md §9, partial
             // liveness): settled for the call, its slot's chunks left carried behind it
             nb::list out;
             for (uint32_t i = 0; i < e.window(); ++i) {
               const auto* f = e.flight(i);
               if (f && f->parked) out.append(nb::make_tuple(i, f->chunk));
             }
             return out;
           })
      .def("stats", &stats_of)
      .def("take_own",
           [](Engine& e) {
             auto& own = e.stats().own;
             nb::bytes out(reinterpret_cast<const char*>(own.data()), own.size());
             own.clear();
             return out;
           },
           "the datagrams of the flights applied as their own async rounds' results since the "
           "last look (an ACK's, a STALE_COUNTED's), PACKET_BYTES each")
      .def("take_forgotten_round_refused",
           [](Engine& e) {
             auto& taken = e.stats().forgotten_round_refused;
             nb::bytes out(reinterpret_cast<const char*>(taken.data()), taken.size());
             taken.clear();
             return out;
           },
           "the datagrams of the flights whose ACK or STALE_COUNTED was taken for 'not counted' "
           "at the round of a packet of another chunk the last abort forgot, since the last "
           "look, PACKET_BYTES each")
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
