// Maps dlstore::Error to the Python classes in dlstore/errors.py, keeping path and offset.
#include <pybind11/pybind11.h>

#include "dlstore/error.hpp"
#include "registry.hpp"

namespace py = pybind11;

void register_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dlstore::Error& e) {
      const char* cls = "DlstoreError";
      switch (e.kind) {
        case dlstore::ErrorKind::Corrupt: cls = "CorruptRecordError"; break;
        case dlstore::ErrorKind::Alignment: cls = "AlignmentError"; break;
        case dlstore::ErrorKind::Gds: cls = "GdsUnavailableError"; break;
        case dlstore::ErrorKind::Io: cls = "DlstoreIOError"; break;
        default: break;
      }
      py::object errors = py::module_::import("dlstore.errors");
      py::object path = e.path.empty() ? py::object(py::none()) : py::object(py::str(e.path));
      py::object offset = e.offset < 0 ? py::object(py::none()) : py::object(py::int_(e.offset));
      py::object exc = errors.attr(cls)(py::str(e.what()), path, offset);
      PyErr_SetObject(py::type::handle_of(exc).ptr(), exc.ptr());
    }
  });
}
