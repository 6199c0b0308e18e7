// Reader, RecordBatch and CRC functions. Each call does a chunk's worth of work with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "buffer_view.hpp"
#include "dlstore/crc32c.hpp"
#include "dlstore/reader.hpp"
#include "registry.hpp"

namespace py = pybind11;
using dlstore::RecordBatch;

namespace {

py::array_t<uint64_t> view_of(const std::vector<uint64_t>& v, py::handle owner) {
  // A read-only numpy view whose base is the batch: no copy, and the batch outlives the view.
  py::array_t<uint64_t> a({static_cast<py::ssize_t>(v.size())}, {static_cast<py::ssize_t>(sizeof(uint64_t))},
                          v.data(), owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

}  // namespace

void register_reader(py::module_& m) {
  py::class_<RecordBatch, std::shared_ptr<RecordBatch>>(m, "RecordBatch", py::buffer_protocol())
      .def_buffer([](RecordBatch& b) {
        return py::buffer_info(const_cast<uint8_t*>(b.base), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.region_len)}, {static_cast<py::ssize_t>(1)},
                               /*readonly=*/true);
      })
      .def_property_readonly("offsets", [](py::object self) { return view_of(self.cast<RecordBatch&>().offsets, self); })
      .def_property_readonly("lengths", [](py::object self) { return view_of(self.cast<RecordBatch&>().lengths, self); })
      .def_property_readonly("file_offsets",
                             [](py::object self) { return view_of(self.cast<RecordBatch&>().file_offsets, self); })
      .def_readonly("file_index", &RecordBatch::file_index)
      .def_readonly("nbytes", &RecordBatch::payload_bytes)
      .def_property_readonly("num_records", &RecordBatch::size)
      .def("__len__", &RecordBatch::size);

  py::class_<dlstore::Reader>(m, "Reader")
      .def(py::init([](std::vector<std::string> paths, const std::string& format, const std::string& engine,
                       std::vector<std::string> compression, bool verify, const std::string& on_error,
                       size_t chunk_size, size_t headroom, size_t depth, size_t threads, size_t max_records,
                       size_t verify_threads, std::vector<std::pair<uint64_t, uint64_t>> ranges,
                       double timeout_s) {
             dlstore::ReaderOptions o;
             o.engine.timeout_s = timeout_s;
             for (const auto& r : ranges) o.ranges.push_back({r.first, r.second});
             o.engine.kind = dlstore::parse_engine(engine);
             o.engine.chunk_size = chunk_size;
             o.engine.headroom = headroom;
             o.engine.depth = depth;
             o.engine.threads = threads;
             o.scan.format = dlstore::parse_format(format);
             o.scan.verify = verify;
             o.scan.on_error = on_error == "skip" ? dlstore::OnError::Skip : dlstore::OnError::Raise;
             o.scan.max_records = max_records;
             o.scan.verify_threads = verify_threads;
             for (const auto& c : compression) o.compression.push_back(dlstore::parse_compression(c));
             return new dlstore::Reader(std::move(paths), o);
           }),
           py::arg("paths"), py::arg("format"), py::arg("engine"), py::arg("compression"), py::arg("verify"),
           py::arg("on_error"), py::arg("chunk_size"), py::arg("headroom"), py::arg("depth"), py::arg("threads"),
           py::arg("max_records"), py::arg("verify_threads"),
           py::arg("ranges") = std::vector<std::pair<uint64_t, uint64_t>>{}, py::arg("timeout_s") = 0.0)
      .def("next_batch",
           [](dlstore::Reader& r) -> py::object {
             auto b = std::make_shared<RecordBatch>();
             bool more;
             {
               py::gil_scoped_release nogil;
               more = r.next_batch(*b);
             }
             if (!more) return py::none();
             return py::cast(b);
           })
      .def("count_all",
           [](dlstore::Reader& r) {
             // Reads to the end without handing batches to Python (used by `verify` and benchmarks
             // that only need the framing and CRC work done).
             RecordBatch b;
             py::gil_scoped_release nogil;
             while (r.next_batch(b)) {
             }
           })
      .def("stats",
           [](const dlstore::Reader& r) {
             dlstore::ReaderStats s = r.stats();
             py::dict d;
             d["records"] = s.records;
             d["payload_bytes"] = s.payload_bytes;
             d["file_bytes_read"] = s.file_bytes_read;
             d["skipped"] = s.skipped;
             d["moved_bytes"] = s.moved_bytes;
             d["spilled_records"] = s.spilled_records;
             d["buffers_allocated"] = s.buffers_allocated;
             return d;
           })
      .def("notes", &dlstore::Reader::notes)
      .def("corruptions", [](const dlstore::Reader& r) {
        py::list out;
        for (const auto& c : r.corruptions())
          out.append(py::make_tuple(r.paths()[c.file_index], c.offset, c.what));
        return out;
      });

  m.def("crc32c",
        [](py::buffer data, uint32_t value) {
          const ContiguousBytes bytes(data);
          py::gil_scoped_release nogil;
          return dlstore::crc32c_extend(value, bytes.data(), bytes.size());
        },
        py::arg("data"), py::arg("value") = 0);
  m.def("masked_crc32c", [](py::buffer data) {
    const ContiguousBytes bytes(data);
    return dlstore::masked_crc32c(bytes.data(), bytes.size());
  });
  m.def("crc32c_is_hardware", &dlstore::crc32c_is_hardware);
}
