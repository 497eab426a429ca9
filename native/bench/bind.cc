// hysync._core.bench: native load generators for bench/ (not part of the data path).
#include <nanobind/stl/string.h>

#include "bench/loadgen.h"
#include "common/registry.h"

namespace nb = nanobind;

namespace {

void bind(nb::module_& m) {
  m.doc() = "Load generators for the benches: cheap senders, so the switch is what is measured.";
  nb::class_<hysync::bench::LoadGenerator>(m, "LoadGenerator")
      .def(nb::init<const std::string&, uint16_t, uint16_t, uint32_t, uint16_t, uint16_t,
                    uint32_t, double>(),
           nb::arg("switch_host"), nb::arg("switch_port"), nb::arg("job"), nb::arg("workers"),
           nb::arg("base_port"), nb::arg("slot_base"), nb::arg("window"), nb::arg("rto_ms"))
      .def("start", &hysync::bench::LoadGenerator::start)
      .def("stop", &hysync::bench::LoadGenerator::stop, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("sent", &hysync::bench::LoadGenerator::sent)
      .def_prop_ro("completed", &hysync::bench::LoadGenerator::completed)
      .def_prop_ro("retransmits", &hysync::bench::LoadGenerator::retransmits);
}

hysync::Binder binder("bench", bind);

}  // namespace
