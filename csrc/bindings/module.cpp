// The extension module dlstore._C: each area registers its own functions.
#include "registry.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "dlstore C++ core: I/O engines, record framing, CRC, Example parsing";
  register_errors(m);
  register_reader(m);
  register_schedule(m);
  register_example(m);
  register_image(m);
}
