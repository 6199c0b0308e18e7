// tf.train.Example parsing: one record into a dict, or a batch into fixed-shape numpy arrays with
// the GIL released. Argument checks and documentation live in dlstore/formats/example.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>
#include <vector>

#include "gil.hpp"
#include "buffer_view.hpp"
#include "dlstore/error.hpp"
#include "dlstore/example_parse.hpp"
#include "registry.hpp"

namespace py = pybind11;

namespace {

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

// The array `out` holds for feature `s`: C-contiguous, writable, of s's dtype, rows of s.length
// values (shape (rows, length), or (rows,) when length is 1), with rows [row, row + n) in range.
// Returns where row `row` starts.
void* output_rows(const py::handle& out, const dlstore::FixedFeatureSpec& s, size_t row, size_t n) {
  if (!py::isinstance<py::array>(out))
    throw py::type_error("out['" + s.name + "'] must be a numpy array");
  auto a = py::reinterpret_borrow<py::array>(out);
  const char* want = s.dtype == dlstore::FixedDtype::Int64   ? "int64"
                     : s.dtype == dlstore::FixedDtype::Int32 ? "int32"
                                                             : "float32";
  if (!a.dtype().is(py::dtype(want)))
    throw py::type_error("out['" + s.name + "'] has dtype " + py::str(a.dtype()).cast<std::string>() +
                         ", expected " + want);
  if (!(a.flags() & py::array::c_style) || !a.writeable())
    throw py::value_error("out['" + s.name + "'] must be C-contiguous and writable");
  if (a.ndim() < 1) throw py::value_error("out['" + s.name + "'] must have a row dimension");
  size_t per_row = 1;
  for (py::ssize_t d = 1; d < a.ndim(); ++d) per_row *= static_cast<size_t>(a.shape(d));
  if (per_row != s.length)
    throw py::value_error("out['" + s.name + "'] rows hold " + std::to_string(per_row) + " values, expected " +
                          std::to_string(s.length));
  const auto rows = static_cast<size_t>(a.shape(0));
  if (row > rows || n > rows - row)
    throw py::value_error("out['" + s.name + "'] has " + std::to_string(rows) + " rows; rows " +
                          std::to_string(row) + ".." + std::to_string(row + n) + " do not fit");
  return static_cast<uint8_t*>(a.mutable_data()) + row * s.length * dlstore::fixed_dtype_size(s.dtype);
}

// spec: list of (name, dtype, length) or (name, dtype, length, default bytes or None).
// Without `out`, returns a dict of new [N, length] arrays; with `out` (a dict name -> array, see
// output_rows), writes record i into row `row + i` of each and returns None.
py::object parse_batch(py::handle buffer, const py::array_t<uint64_t, py::array::c_style>& offsets,
                       const py::array_t<uint64_t, py::array::c_style>& lengths, const py::list& spec,
                       const py::object& out, size_t row, size_t threads) {
  if (offsets.ndim() != 1 || lengths.ndim() != 1 || offsets.size() != lengths.size())
    throw py::value_error("offsets and lengths must be 1-D arrays of the same size");
  const size_t n = static_cast<size_t>(offsets.size());
  if (out.is_none() && row != 0) throw py::value_error("row is an offset into `out`; without `out` it must be 0");

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

  std::vector<py::array> arrays;  // new arrays when there is no `out`
  std::vector<void*> outputs;
  if (out.is_none()) {
    for (const dlstore::FixedFeatureSpec& s : native) {
      arrays.push_back(new_rows(s.dtype, n, s.length));
      outputs.push_back(arrays.back().mutable_data());
    }
  } else {
    const auto targets = out.cast<py::dict>();
    for (const dlstore::FixedFeatureSpec& s : native) {
      const py::str key(s.name);
      if (!targets.contains(key)) throw py::key_error("out has no array for feature '" + s.name + "'");
      outputs.push_back(output_rows(targets[key], s, row, n));
    }
  }

  const ContiguousBytes bytes(buffer);
  dlstore_bindings::without_gil([&] {
    dlstore::parse_example_batch_parallel(bytes.data(), bytes.size(), offsets.data(), lengths.data(), n,
                                          native, outputs.data(), threads);
  });
  if (!out.is_none()) return py::none();
  py::dict result;
  for (size_t j = 0; j < native.size(); ++j) result[py::str(native[j].name)] = arrays[j];
  return std::move(result);
}

}  // namespace

void register_example(py::module_& m) {
  m.def("parse_example", &parse_one, py::arg("data"),
        "One serialized tf.train.Example -> dict; see dlstore.formats.example.parse_example.");
  m.def("parse_example_batch", &parse_batch, py::arg("buffer"), py::arg("offsets"), py::arg("lengths"),
        py::arg("spec"), py::arg("out") = py::none(), py::arg("row") = 0, py::arg("threads") = 1,
        "Records of one buffer -> dict of [N, length] arrays, or into rows row.. of the arrays of `out`; "
        "see dlstore.formats.example.parse_batch.");
}
