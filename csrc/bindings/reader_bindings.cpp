// Reader, RecordBatch and CRC functions. Each call does a chunk's worth of work with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "gil.hpp"
#include "buffer_view.hpp"
#include "dlstore/crc32c.hpp"
#include "dlstore/engine_io_uring.hpp"
#include "dlstore/plan_reader.hpp"
#include "dlstore/reader.hpp"
#include "plan_stats.hpp"
#include "registry.hpp"

namespace py = pybind11;
using dlstore::RecordBatch;

namespace {

dlstore::OnError parse_on_error(const std::string& name) {
  if (name == "raise") return dlstore::OnError::Raise;
  if (name == "skip") return dlstore::OnError::Skip;
  throw py::value_error("on_error must be 'raise' or 'skip', not '" + name + "'");
}

const char* on_error_name(dlstore::OnError e) { return e == dlstore::OnError::Raise ? "raise" : "skip"; }

// The fields of EngineOptions, on the options class of either reader (O has a member `engine`), under
// the names of dlstore.ReadOptions. Python checks the values (dlstore/settings.py); here they are stored.
template <class O>
void engine_fields(py::class_<O>& c) {
  c.def_property("engine", [](const O& o) { return o.engine.engine; },
                 [](O& o, const std::string& v) { o.engine.engine = v; })
      .def_property("chunk_size", [](const O& o) { return o.engine.chunk_size; },
                    [](O& o, size_t v) { o.engine.chunk_size = v; })
      .def_property("depth", [](const O& o) { return o.engine.depth; }, [](O& o, size_t v) { o.engine.depth = v; })
      .def_property("io_threads", [](const O& o) { return o.engine.threads; },
                    [](O& o, size_t v) { o.engine.threads = v; })
      .def_property("read_timeout", [](const O& o) { return o.engine.timeout_s; },
                    [](O& o, double v) { o.engine.timeout_s = v; })
      .def_property("queue_depth", [](const O& o) { return o.engine.queue_depth; },
                    [](O& o, size_t v) { o.engine.queue_depth = v; })
      .def_property("direct_cache", [](const O& o) { return o.engine.direct_cache; },
                    [](O& o, bool v) { o.engine.direct_cache = v; });
}

// Options pickle as the dict of their fields, so that a Dataset holding them pickles (DataLoader workers
// started with spawn or forkserver) and copies.
template <class O>
void picklable(py::class_<O>& c, std::vector<std::string> names) {
  c.def(py::pickle(
      [names](py::object self) {
        py::dict d;
        for (const std::string& n : names) d[py::str(n)] = self.attr(n.c_str());
        return d;
      },
      [](py::dict d) {
        O o;
        py::object obj = py::cast(&o, py::return_value_policy::reference);
        for (auto item : d) py::setattr(obj, item.first, item.second);
        return o;
      }));
}

// What both readers expose alike: the next batch (the GIL released while it is read), and the
// corruptions skipped as (path, offset, what).
template <class R>
py::object next_batch_of(R& reader) {
  auto b = std::make_shared<RecordBatch>();
  const bool more = dlstore_bindings::without_gil([&] { return reader.next_batch(*b); });
  if (!more) return py::none();
  return py::cast(b);
}

template <class R>
py::list corruptions_of(const R& reader) {
  py::list out;
  for (const auto& c : reader.corruptions())
    out.append(py::make_tuple(reader.paths()[c.file_index], c.offset, c.what));
  return out;
}

template <class T>
std::vector<T> vector_of(py::handle array) {
  auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(array);
  if (!a || a.ndim() != 1) throw py::value_error("expected a one-dimensional array of integers");
  return std::vector<T>(a.data(), a.data() + a.shape(0));
}

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
      .def_property_readonly("file_indices",
                             [](py::object self) {
                               RecordBatch& b = self.cast<RecordBatch&>();
                               if (b.file_indices.empty() && b.size() > 0)
                                 b.file_indices.assign(b.size(), b.file_index);  // one file for all
                               return view_of(b.file_indices, self);
                             })
      .def("path",
           [](const RecordBatch& b, size_t i) -> py::object {
             if (i >= b.size()) throw py::index_error("record " + std::to_string(i) + " of a batch of " +
                                                      std::to_string(b.size()));
             if (!b.paths || b.file_of(i) >= b.paths->size()) return py::none();
             return py::str((*b.paths)[b.file_of(i)]);
           },
           py::arg("i"))
      .def("slice",
           [](const RecordBatch& b, size_t start, size_t stop) {
             // Records [start, stop) of this batch, sharing its buffer (no copy).
             stop = std::min(stop, b.size());
             start = std::min(start, stop);
             auto out = std::make_shared<RecordBatch>();
             out->owner = b.owner;
             out->base = b.base;
             out->region_len = b.region_len;
             out->paths = b.paths;
             out->offsets.assign(b.offsets.begin() + start, b.offsets.begin() + stop);
             out->lengths.assign(b.lengths.begin() + start, b.lengths.begin() + stop);
             out->file_offsets.assign(b.file_offsets.begin() + start, b.file_offsets.begin() + stop);
             if (!b.file_indices.empty())
               out->file_indices.assign(b.file_indices.begin() + start, b.file_indices.begin() + stop);
             out->file_index = start < stop ? b.file_of(start) : b.file_index;
             for (uint64_t n : out->lengths) out->payload_bytes += n;
             return out;
           },
           py::arg("start"), py::arg("stop"))
      .def_readonly("nbytes", &RecordBatch::payload_bytes)
      .def_property_readonly("num_records", &RecordBatch::size)
      .def("__len__", &RecordBatch::size);

  // The options of each reader, as dlstore.ReadOptions.core() builds them.
  py::class_<dlstore::ReaderOptions> reader_options(m, "ReaderOptions");
  reader_options.def(py::init<>());
  engine_fields(reader_options);
  reader_options.def_readwrite("headroom", &dlstore::ReaderOptions::headroom)
      .def_property("verify", [](const dlstore::ReaderOptions& o) { return o.scan.verify; },
                    [](dlstore::ReaderOptions& o, bool v) { o.scan.verify = v; })
      .def_property("on_error", [](const dlstore::ReaderOptions& o) { return on_error_name(o.scan.on_error); },
                    [](dlstore::ReaderOptions& o, const std::string& v) { o.scan.on_error = parse_on_error(v); })
      .def_property("verify_threads", [](const dlstore::ReaderOptions& o) { return o.scan.verify_threads; },
                    [](dlstore::ReaderOptions& o, size_t v) { o.scan.verify_threads = v; })
      .def_property("max_records", [](const dlstore::ReaderOptions& o) { return o.scan.max_records; },
                    [](dlstore::ReaderOptions& o, size_t v) { o.scan.max_records = v; });
  picklable(reader_options, {"engine", "chunk_size", "depth", "io_threads", "read_timeout", "queue_depth", "direct_cache", "headroom",
                             "verify", "on_error", "verify_threads", "max_records"});

  py::class_<dlstore::PlanOptions> plan_options(m, "PlanOptions");
  plan_options.def(py::init<>());
  engine_fields(plan_options);
  plan_options.def_readwrite("verify", &dlstore::PlanOptions::verify)
      .def_property("on_error", [](const dlstore::PlanOptions& o) { return on_error_name(o.on_error); },
                    [](dlstore::PlanOptions& o, const std::string& v) { o.on_error = parse_on_error(v); })
      .def_readwrite("max_open_files", &dlstore::PlanOptions::max_open_files);
  picklable(plan_options, {"engine", "chunk_size", "depth", "io_threads", "read_timeout", "queue_depth", "direct_cache",
                           "verify", "on_error", "max_open_files"});

  m.def("engine_names", &dlstore::engine_names);
  m.def("io_uring_refusal", &dlstore::io_uring_refusal);
  m.def(
      "page_cache_holds",
      [](const std::string& path, uint64_t offset, size_t n, const std::string& how) {
        const dlstore::CacheProbe probe = how == "cachestat" ? dlstore::CacheProbe::Cachestat
                                          : how == "mincore" ? dlstore::CacheProbe::Mincore
                                                             : dlstore::CacheProbe::Auto;
        if (probe == dlstore::CacheProbe::Auto && how != "auto")
          throw py::value_error("how must be 'auto', 'cachestat' or 'mincore', not '" + how + "'");
        dlstore::FileHandle fh(path, false);
        return dlstore::page_cache_holds(fh.fd(), offset, n, probe);
      },
      py::arg("path"), py::arg("offset"), py::arg("n"), py::arg("how") = "auto",
      "Whether the page cache holds every page of bytes [offset, offset + n) of `path`, as the O_DIRECT "
      "engines ask before a read (direct_cache); `how` forces cachestat(2) or mincore(2).");
  m.def(
      "cached_pages",
      [](const std::string& path) -> py::object {
        dlstore::FileHandle fh(path, false);
        uint64_t pages = 0;
        const int64_t held = dlstore::cached_pages(fh.fd(), 0, fh.size(), dlstore::CacheProbe::Auto, &pages);
        if (held < 0) return py::none();
        return py::make_tuple(held, pages);
      },
      py::arg("path"),
      "(pages the page cache holds, pages) of the whole file `path`, by the calls page_cache_holds makes; None "
      "where the kernel does not tell this process (not the file's owner or writer, nor CAP_FOWNER).");
  m.def("io_uring_queue_depth",
        [](const std::string& path, size_t setting) {
          std::string why;
          const size_t depth = dlstore::io_uring_queue_depth(path, setting, &why);
          return py::make_tuple(depth, why);
        },
        py::arg("path"), py::arg("setting") = 0);
  m.def("_simulate_io_uring_refusal", &dlstore::simulate_io_uring_refusal, py::arg("why"));

  py::class_<dlstore::Reader>(m, "Reader")
      .def(py::init([](std::vector<std::string> paths, const std::string& format,
                       std::vector<std::string> compression, dlstore::ReaderOptions options,
                       std::vector<std::pair<uint64_t, uint64_t>> ranges) {
             for (const auto& r : ranges) options.ranges.push_back({r.first, r.second});
             options.scan.format = dlstore::parse_format(format);
             for (const auto& c : compression) options.compression.push_back(dlstore::parse_compression(c));
             return new dlstore::Reader(std::move(paths), options);
           }),
           py::arg("paths"), py::arg("format"), py::arg("compression"), py::arg("options"),
           py::arg("ranges") = std::vector<std::pair<uint64_t, uint64_t>>{})
      .def("next_batch", &next_batch_of<dlstore::Reader>)
      .def("count_all",
           [](dlstore::Reader& r) {
             // Reads to the end without handing batches to Python (used by `verify` and benchmarks
             // that only need the framing and CRC work done).
             RecordBatch b;
             dlstore_bindings::without_gil([&] {
               while (r.next_batch(b)) {
               }
             });
           })
      .def("stats",
           [](const dlstore::Reader& r) {
             dlstore::ReaderStats s = r.stats();
             py::dict d;
             d["records"] = s.records;
             d["payload_bytes"] = s.payload_bytes;
             d["file_bytes_read"] = s.file_bytes_read;
             d["cache_bytes_read"] = s.cache_bytes_read;
             d["skipped"] = s.skipped;
             d["moved_bytes"] = s.moved_bytes;
             d["spilled_records"] = s.spilled_records;
             d["buffers_allocated"] = s.buffers_allocated;
             return d;
           })
      .def("close", [](dlstore::Reader& r) { dlstore_bindings::without_gil([&] { r.close(); }); },
           "Ends the reads in flight (waited for up to the read timeout), so the files close with the reader.")
      .def("notes", &dlstore::Reader::notes)
      .def("corruptions", &corruptions_of<dlstore::Reader>);

  py::class_<dlstore::PlanReader>(m, "PlanReader")
      .def(py::init([](std::vector<std::string> paths, py::handle file, py::handle offset, py::handle size,
                       py::handle emit, const std::string& format, size_t batch_size, dlstore::PlanOptions o,
                       uint64_t hold_bytes, bool sequential, size_t first_batch, py::handle device) {
             dlstore::ReadPlan plan;
             plan.paths = std::move(paths);
             plan.file = vector_of<uint32_t>(file);
             plan.offset = vector_of<uint64_t>(offset);
             plan.size = vector_of<uint64_t>(size);
             if (!emit.is_none()) plan.emit = vector_of<int64_t>(emit);
             if (!device.is_none()) plan.device = vector_of<uint32_t>(device);
             o.format = dlstore::parse_format(format);
             o.batch_size = batch_size;
             o.first_batch = first_batch;
             o.hold_bytes = hold_bytes;
             o.sequential = sequential;
             return dlstore_bindings::without_gil([&] { return new dlstore::PlanReader(std::move(plan), o); });
           }),
           py::arg("paths"), py::arg("file"), py::arg("offset"), py::arg("size"), py::arg("emit"),
           py::arg("format"), py::arg("batch_size"), py::arg("options"), py::arg("hold_bytes") = 0,
           py::arg("sequential") = true, py::arg("first_batch") = 0, py::arg("device") = py::none())
      .def("next_batch", &next_batch_of<dlstore::PlanReader>)
      .def("start", [](dlstore::PlanReader& r) { dlstore_bindings::without_gil([&] { r.start(); }); },
           "Starts the first reads without waiting for any (a reader made ahead of its turn).")
      .def("close", [](dlstore::PlanReader& r) { dlstore_bindings::without_gil([&] { r.close(); }); },
           "Ends the reads in flight (waited for up to the read timeout), so the files close with the reader.")
      .def_property_readonly("position", &dlstore::PlanReader::position)
      .def("__len__", &dlstore::PlanReader::size)
      .def("stats", [](const dlstore::PlanReader& r) { return plan_stats_dict(r.stats()); })
      .def("notes", &dlstore::PlanReader::notes)
      .def("corruptions", &corruptions_of<dlstore::PlanReader>);

  m.def("crc32c",
        [](py::buffer data, uint32_t value) {
          const ContiguousBytes bytes(data);
          return dlstore_bindings::without_gil([&] { return dlstore::crc32c_extend(value, bytes.data(), bytes.size()); });
        },
        py::arg("data"), py::arg("value") = 0);
  m.def("masked_crc32c", [](py::buffer data) {
    const ContiguousBytes bytes(data);
    return dlstore::masked_crc32c(bytes.data(), bytes.size());
  });
  m.def("crc32c_is_hardware", &dlstore::crc32c_is_hardware);
}
