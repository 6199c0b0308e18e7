// ReadSchedule for executors written in Python (the GPU reader), and the frame check by record.
// Steps come back as tuples of a kind and numpy arrays: a call per read, wait or batch, never per record.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "buffer_view.hpp"
#include "dlstore/error.hpp"
#include "dlstore/read_schedule.hpp"
#include "dlstore/record_frame.hpp"
#include "plan_stats.hpp"
#include "registry.hpp"

namespace py = pybind11;
using dlstore::Step;

py::dict plan_stats_dict(const dlstore::PlanStats& s) {
  py::dict d;
  d["records"] = s.records;
  d["payload_bytes"] = s.payload_bytes;
  d["file_bytes_read"] = s.file_bytes_read;
  d["cache_bytes_read"] = s.cache_bytes_read;
  d["skipped"] = s.skipped;
  d["chunks"] = s.chunks;
  d["gathered_batches"] = s.gathered_batches;
  d["gathered_bytes"] = s.gathered_bytes;
  d["spilled_records"] = s.spilled_records;
  d["spilled_bytes"] = s.spilled_bytes;
  d["peak_held_bytes"] = s.peak_held_bytes;
  d["buffers_allocated"] = s.buffers_allocated;
  return d;
}

namespace {

template <class T>
std::vector<T> as_vector(py::handle array) {
  auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(array);
  if (!a || a.ndim() != 1) throw py::value_error("expected a one-dimensional array of integers");
  return std::vector<T>(a.data(), a.data() + a.shape(0));
}

template <class T>
py::array_t<int64_t> int64_array(const std::vector<T>& v) {
  py::array_t<int64_t> a(static_cast<py::ssize_t>(v.size()));
  int64_t* p = a.mutable_data();
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<int64_t>(v[i]);
  return a;
}

py::object step_tuple(const dlstore::ReadSchedule& s, const Step& st) {
  switch (st.kind) {
    case Step::Kind::Read: {
      const std::vector<dlstore::Piece> pieces = s.pieces(st.chunk);
      std::vector<int64_t> file, start, end, first, last;
      for (const auto& p : pieces) {
        file.push_back(p.file);
        start.push_back(static_cast<int64_t>(p.start));
        end.push_back(static_cast<int64_t>(p.end));
        first.push_back(static_cast<int64_t>(p.first));
        last.push_back(static_cast<int64_t>(p.last));
      }
      return py::make_tuple("read", st.chunk, int64_array(file), int64_array(start), int64_array(end),
                            int64_array(first), int64_array(last));
    }
    case Step::Kind::Wait: return py::make_tuple("wait", st.chunk);
    case Step::Kind::Spill: return py::make_tuple("spill", st.chunk, int64_array(st.positions));
    case Step::Kind::Release: return py::make_tuple("release", st.chunk);
    case Step::Kind::Batch: return py::make_tuple("batch", int64_array(st.positions), int64_array(st.chunks));
    case Step::Kind::End: break;
  }
  return py::none();
}

}  // namespace

void register_schedule(py::module_& m) {
  py::class_<dlstore::ReadSchedule>(m, "ReadSchedule")
      .def(py::init([](std::vector<std::string> paths, py::handle file, py::handle offset, py::handle size,
                       py::handle emit, py::handle device, uint64_t chunk_size, size_t depth, size_t batch_size,
                       size_t first_batch, uint64_t hold_bytes, const std::string& on_error, size_t max_chunk_files) {
             dlstore::ReadPlan plan;
             plan.paths = std::move(paths);
             plan.file = as_vector<uint32_t>(file);
             plan.offset = as_vector<uint64_t>(offset);
             plan.size = as_vector<uint64_t>(size);
             if (!emit.is_none()) plan.emit = as_vector<int64_t>(emit);
             if (!device.is_none()) plan.device = as_vector<uint32_t>(device);
             dlstore::ScheduleOptions o;
             o.chunk_size = chunk_size;
             o.depth = depth;
             o.batch_size = batch_size;
             o.first_batch = first_batch;
             o.hold_bytes = hold_bytes;
             o.on_error = on_error == "raise" ? dlstore::OnError::Raise : dlstore::OnError::Skip;
             o.max_chunk_files = max_chunk_files;
             return new dlstore::ReadSchedule(std::move(plan), o);
           }),
           py::arg("paths"), py::arg("file"), py::arg("offset"), py::arg("size"), py::arg("emit"),
           py::arg("device") = py::none(), py::arg("chunk_size"), py::arg("depth"), py::arg("batch_size"),
           py::arg("first_batch") = 0, py::arg("hold_bytes") = 0, py::arg("on_error") = "raise",
           py::arg("max_chunk_files") = 0)
      .def("next", [](dlstore::ReadSchedule& s) { return step_tuple(s, s.next()); })
      .def("arrived",
           [](dlstore::ReadSchedule& s, size_t chunk, uint64_t bytes_read, uint64_t held_bytes, py::handle bad,
              py::handle bad_at, std::vector<std::string> bad_what, int64_t failed_from, const std::string& failure,
              const std::string& failure_path, int64_t failure_offset) {
             dlstore::Arrival a;
             a.bytes_read = bytes_read;
             a.held_bytes = held_bytes;
             a.bad = as_vector<int64_t>(bad);
             a.bad_at = as_vector<uint64_t>(bad_at);
             a.bad_what = std::move(bad_what);
             if (failed_from >= 0) {
               a.failed_from = static_cast<size_t>(failed_from);
               dlstore::Error e(dlstore::ErrorKind::Io, failure, failure_path, failure_offset);
               a.failure = std::make_exception_ptr(e);
             }
             s.arrived(chunk, std::move(a));
           },
           py::arg("chunk"), py::arg("bytes_read"), py::arg("held_bytes"), py::arg("bad"), py::arg("bad_at"),
           py::arg("bad_what"), py::arg("failed_from") = -1, py::arg("failure") = "", py::arg("failure_path") = "",
           py::arg("failure_offset") = -1)
      .def_property_readonly("position", &dlstore::ReadSchedule::position)
      .def_property_readonly("num_chunks", &dlstore::ReadSchedule::num_chunks)
      .def("chunk_device", &dlstore::ReadSchedule::chunk_device, py::arg("chunk"))
      .def("__len__", &dlstore::ReadSchedule::size)
      .def("stats", [](const dlstore::ReadSchedule& s) { return plan_stats_dict(s.stats()); })
      .def("corruptions", [](const dlstore::ReadSchedule& s) {
        py::list out;
        for (const auto& c : s.corruptions())
          out.append(py::make_tuple(s.plan().paths[c.file_index], c.offset, c.what));
        return out;
      });

  m.def("frame_problem",
        [](py::buffer frame, const std::string& format, bool verify, bool file_tail) -> py::object {
          // What is wrong with one indexed frame, in the host engines' words: (what, frame-relative offset),
          // or None when it is sound. The GPU reader asks it of the rare frames its kernel flags;
          // `file_tail`: the frame runs to the end of its file.
          const ContiguousBytes bytes(frame);
          dlstore::FramedRecord rec;
          uint64_t at = 0;
          std::string what = dlstore::check_frame(dlstore::parse_format(format), bytes.data(), bytes.size(), verify,
                                                  file_tail, rec, &at);
          if (what.empty()) return py::none();
          return py::make_tuple(what, at);
        },
        py::arg("frame"), py::arg("format") = "tfrecord", py::arg("verify") = true, py::arg("file_tail") = false);
}
