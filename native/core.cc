// hysync._core: one submodule per part of the data path (see registry.h).
#include "common/registry.h"

NB_MODULE(_core, m) {
  m.doc() = "HySync's compiled data path: wire constants, softswitch data plane, worker engine.";
  for (hysync::Binder* binder : hysync::Binder::all()) {
    nanobind::module_ sub = m.def_submodule(binder->name);
    binder->fn(sub);
  }
}
