// How each part of the core binds itself to Python: a static Binder in its bind.cc adds a
// function that fills the submodule hysync._core.<name>. core.cc needs to know none of them.
#pragma once
#include <nanobind/nanobind.h>

#include <vector>

namespace hysync {

struct Binder {
  using Fn = void (*)(nanobind::module_&);
  const char* name;
  Fn fn;
  Binder(const char* n, Fn f) : name(n), fn(f) { all().push_back(this); }
  static std::vector<Binder*>& all() {
    static std::vector<Binder*> binders;  // function-local: safe from static init order
    return binders;
  }
};

}  // namespace hysync
