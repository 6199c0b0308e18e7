// Maps dlstore::Error to the Python classes in dlstore/errors.py, keeping its fields: path, offset,
// record, errno and the reason without its location prefixes.
//
// The translator is module-local: only this module's functions raise these errors, and a global one would
// sit in pybind11's internals beside those of every extension sharing them.
#include <pybind11/pybind11.h>

#include "dlstore/error.hpp"
#include "registry.hpp"

namespace py = pybind11;

void register_errors(py::module_& m) {
  (void)m;
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dlstore::Error& e) {
      const char* cls = "DlstoreError";
      switch (e.kind) {
        case dlstore::ErrorKind::Corrupt: cls = "CorruptRecordError"; break;
        case dlstore::ErrorKind::Io: cls = "DlstoreIOError"; break;
        default: break;
      }
      py::object errors = py::module_::import("dlstore.errors");
      py::object path = e.path.empty() ? py::object(py::none()) : py::object(py::str(e.path));
      py::object offset = e.offset < 0 ? py::object(py::none()) : py::object(py::int_(e.offset));
      py::object record = e.record < 0 ? py::object(py::none()) : py::object(py::int_(e.record));
      py::object err = e.err == 0 ? py::object(py::none()) : py::object(py::int_(e.err));
      py::object exc = errors.attr(cls)(py::str(e.what()), path, offset, py::arg("record") = record,
                                        py::arg("errno") = err, py::arg("reason") = py::str(e.reason));
      PyErr_SetObject(py::type::handle_of(exc).ptr(), exc.ptr());
    }
  });
}
