// The extension module dlstore._C: each area registers its own functions.
#include "gil.hpp"
#include "registry.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "dlstore C++ core: I/O engines, record framing, CRC, Example parsing";
  register_errors(m);
  register_reader(m);
  register_schedule(m);
  register_example(m);
  register_image(m);
  // Python's atexit hooks run before finalization begins: from then on a thread coming back from C++, other
  // than the one finalizing, waits for the process to end instead of being ended inside a C++ frame (gil.hpp). Hooks run last
  // registered first, so those of dlstore's own Python (a loader waiting for its thread) run before.
  pybind11::module_::import("atexit").attr("register")(
      pybind11::cpp_function([] { dlstore_bindings::mark_exiting(); }));
}
