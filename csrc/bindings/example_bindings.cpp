// tf.train.Example parsing: one record into a dict, or a batch into fixed-shape numpy arrays with
// the GIL released. Argument checks and documentation live in dlstore/formats/example.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>
#include <vector>

#include "dlstore/error.hpp"
#include "dlstore/example_parse.hpp"
#include "registry.hpp"

namespace py = pybind11;

namespace {

// Holds a contiguous byte view of a Python object. While held, the exporter may not resize or free
// the memory (a bytearray refuses to), so the view stays valid with the GIL released.
class ContiguousBytes {
 public:
  explicit ContiguousBytes(py::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  }
  ~ContiguousBytes() { PyBuffer_Release(&view_); }
  ContiguousBytes(const ContiguousBytes&) = delete;
  ContiguousBytes& operator=(const ContiguousBytes&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

py::str feature_name(std::string_view name, const uint8_t* record) {
  PyObject* s = PyUnicode_DecodeUTF8(name.data(), static_cast<Py_ssize_t>(name.size()), nullptr);
  if (!s) {
    PyErr_Clear();
    throw dlstore::Error(dlstore::ErrorKind::Corrupt,
                         "at byte " + std::to_string(reinterpret_cast<const uint8_t*>(name.data()) - record) +
                             " of the record: a feature name is not valid UTF-8");
  }
  return py::reinterpret_steal<py::str>(s);
}

template <class T>
py::array_t<T> to_array(const std::vector<T>& values) {
  py::array_t<T> a(static_cast<py::ssize_t>(values.size()));
  if (!values.empty()) std::memcpy(a.mutable_data(), values.data(), values.size() * sizeof(T));
  return a;
}

py::dict parse_one(py::handle record) {
  const ContiguousBytes bytes(record);
  const dlstore::ParsedExample parsed = dlstore::parse_example(bytes.data(), bytes.size());
  py::dict out;
  for (const dlstore::ParsedFeature& f : parsed.features) {
    py::str name = feature_name(f.name, bytes.data());
    switch (f.kind) {
      case dlstore::FeatureKind::Int64: out[name] = to_array(f.int64_values); break;
      case dlstore::FeatureKind::Float: out[name] = to_array(f.float_values); break;
      default: {
        py::list values(f.bytes_values.size());
        for (size_t k = 0; k < f.bytes_values.size(); ++k)
          values[k] = py::bytes(f.bytes_values[k].data(), f.bytes_values[k].size());
        out[name] = std::move(values);
      }
    }
  }
  return out;
}

dlstore::FixedDtype parse_dtype(const std::string& name) {
  if (name == "int64") return dlstore::FixedDtype::Int64;
  if (name == "int32") return dlstore::FixedDtype::Int32;
  if (name == "float32") return dlstore::FixedDtype::Float32;
  throw py::value_error("unsupported batch dtype '" + name + "' (int64, int32 or float32)");
}

py::array new_rows(dlstore::FixedDtype dtype, size_t rows, size_t length) {
  const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(length)};
  switch (dtype) {
    case dlstore::FixedDtype::Int64: return py::array_t<int64_t>(shape);
    case dlstore::FixedDtype::Int32: return py::array_t<int32_t>(shape);
    default: return py::array_t<float>(shape);
  }
}

// spec: list of (name, dtype, length) or (name, dtype, length, default bytes or None).
py::dict parse_batch(py::handle buffer, const py::array_t<uint64_t, py::array::c_style>& offsets,
                     const py::array_t<uint64_t, py::array::c_style>& lengths, const py::list& spec) {
  if (offsets.ndim() != 1 || lengths.ndim() != 1 || offsets.size() != lengths.size())
    throw py::value_error("offsets and lengths must be 1-D arrays of the same size");
  const size_t n = static_cast<size_t>(offsets.size());

  std::vector<dlstore::FixedFeatureSpec> native;
  native.reserve(spec.size());
  for (py::handle item : spec) {
    const auto entry = py::reinterpret_borrow<py::tuple>(item);
    if (entry.size() != 3 && entry.size() != 4)
      throw py::value_error("a spec entry is (name, dtype, length[, default])");
    dlstore::FixedFeatureSpec s;
    s.name = entry[0].cast<std::string>();
    s.dtype = parse_dtype(entry[1].cast<std::string>());
    s.length = entry[2].cast<size_t>();
    if (entry.size() == 4 && !entry[3].is_none()) {
      const std::string d = entry[3].cast<std::string>();
      s.has_default = true;
      s.default_row.assign(d.begin(), d.end());
    }
    native.push_back(std::move(s));
  }

  std::vector<py::array> arrays;
  std::vector<void*> outputs;
  for (const dlstore::FixedFeatureSpec& s : native) {
    arrays.push_back(new_rows(s.dtype, n, s.length));
    outputs.push_back(arrays.back().mutable_data());
  }

  const ContiguousBytes bytes(buffer);
  {
    py::gil_scoped_release release;
    dlstore::parse_example_batch(bytes.data(), bytes.size(), offsets.data(), lengths.data(), n, native,
                                 outputs.data());
  }
  py::dict out;
  for (size_t j = 0; j < native.size(); ++j) out[py::str(native[j].name)] = arrays[j];
  return out;
}

}  // namespace

void register_example(py::module_& m) {
  m.def("parse_example", &parse_one, py::arg("data"),
        "One serialized tf.train.Example -> dict; see dlstore.formats.example.parse_example.");
  m.def("parse_example_batch", &parse_batch, py::arg("buffer"), py::arg("offsets"), py::arg("lengths"),
        py::arg("spec"),
        "Records of one buffer -> dict of [N, length] arrays; see dlstore.formats.example.parse_batch.");
}
