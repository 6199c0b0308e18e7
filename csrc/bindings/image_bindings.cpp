// Image decoding for the ResNet-50 pipeline: the batch JPEG decoder (GIL released), the crop
// geometry it uses (so that the Pillow fallback and the tests draw the same crops), and where the
// encoded images lie inside tf.train.Example records. Argument checks and documentation live in
// dlstore/pipeline/decode.py and dlstore/formats/example.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "gil.hpp"
#include "buffer_view.hpp"
#include "dlstore/error.hpp"
#include "dlstore/example_parse.hpp"
#include "dlstore/image_ops.hpp"
#include "dlstore/jpeg.hpp"
#include "registry.hpp"

namespace py = pybind11;

namespace {

using U64Array = py::array_t<uint64_t, py::array::c_style>;

dlstore::AugmentParams augment_params(bool train, std::pair<double, double> scale, std::pair<double, double> ratio,
                                      double flip_probability, int eval_resize) {
  dlstore::AugmentParams p;
  p.train = train;
  p.random_crop.scale_min = scale.first;
  p.random_crop.scale_max = scale.second;
  p.random_crop.ratio_min = ratio.first;
  p.random_crop.ratio_max = ratio.second;
  p.random_crop.flip_probability = flip_probability;
  p.eval_resize = eval_resize;
  return p;
}

size_t same_length(const std::vector<const py::array*>& arrays) {
  const py::ssize_t n = arrays.front()->size();
  for (const py::array* a : arrays)
    if (a->ndim() != 1 || a->size() != n) throw py::value_error("per-image arrays must be 1-D and of one length");
  return static_cast<size_t>(n);
}

// (windows [N, 4] as x, y, w, h in pixels of the full image, flip [N] bool, dct_scale [N] int8: M of M/8)
py::tuple crop_windows(const py::array_t<int64_t, py::array::c_style>& heights,
                       const py::array_t<int64_t, py::array::c_style>& widths, const U64Array& seeds, bool train,
                       int out_h, int out_w, std::pair<double, double> scale, std::pair<double, double> ratio,
                       double flip_probability, int eval_resize) {
  const size_t n = same_length({&heights, &widths, &seeds});
  const dlstore::AugmentParams p = augment_params(train, scale, ratio, flip_probability, eval_resize);
  py::array_t<double> windows({static_cast<py::ssize_t>(n), py::ssize_t(4)});
  py::array_t<bool> flips(static_cast<py::ssize_t>(n));
  py::array_t<int8_t> scales(static_cast<py::ssize_t>(n));
  double* w = windows.mutable_data();
  for (size_t i = 0; i < n; ++i) {
    const int h = static_cast<int>(heights.data()[i]), wd = static_cast<int>(widths.data()[i]);
    if (h <= 0 || wd <= 0) throw py::value_error("image " + std::to_string(i) + " has no pixels");
    const dlstore::CropWindow c = dlstore::plan_crop(h, wd, seeds.data()[i], p, out_h, out_w);
    w[4 * i] = c.x;
    w[4 * i + 1] = c.y;
    w[4 * i + 2] = c.w;
    w[4 * i + 3] = c.h;
    flips.mutable_data()[i] = c.flip;
    scales.mutable_data()[i] = static_cast<int8_t>(dlstore::choose_dct_scale(c, out_h, out_w));
  }
  return py::make_tuple(windows, flips, scales);
}

// The layout `out` asks for: uint8 [N, H, W, 3] or float32 [N, 3, H, W], C-contiguous and writable.
dlstore::OutputSpec output_spec(const py::array& out, size_t n, const std::vector<double>& mean,
                                const std::vector<double>& std) {
  if (!(out.flags() & py::array::c_style) || !out.writeable())
    throw py::value_error("out must be C-contiguous and writable");
  if (out.ndim() != 4 || static_cast<size_t>(out.shape(0)) != n)
    throw py::value_error("out must be 4-D with one slot per image");
  dlstore::OutputSpec spec;
  if (out.dtype().is(py::dtype::of<uint8_t>())) {
    if (out.shape(3) != 3) throw py::value_error("uint8 out must be [N, H, W, 3]");
    spec.layout = dlstore::OutputLayout::HwcUint8;
    spec.height = static_cast<int>(out.shape(1));
    spec.width = static_cast<int>(out.shape(2));
  } else if (out.dtype().is(py::dtype::of<float>())) {
    if (out.shape(1) != 3) throw py::value_error("float32 out must be [N, 3, H, W]");
    spec.layout = dlstore::OutputLayout::ChwFloat32;
    spec.height = static_cast<int>(out.shape(2));
    spec.width = static_cast<int>(out.shape(3));
    if (mean.size() != 3 || std.size() != 3) throw py::value_error("mean and std need 3 values");
    for (int c = 0; c < 3; ++c) {
      spec.scale[c] = static_cast<float>(1.0 / (255.0 * std[c]));
      spec.bias[c] = static_cast<float>(-mean[c] / std[c]);
    }
  } else {
    throw py::type_error("out must be uint8 [N, H, W, 3] or float32 [N, 3, H, W]");
  }
  if (spec.height <= 0 || spec.width <= 0) throw py::value_error("out has no pixels");
  return spec;
}

// -> (status uint8 [N]: 0 decoded, 1 failed and zero-filled; [(index, libjpeg's message)] of failures)
py::tuple decode_batch(dlstore::JpegBatchDecoder& decoder, py::handle buffer, const U64Array& offsets,
                       const U64Array& lengths, const U64Array& seeds, const py::array& out, bool train,
                       const std::vector<double>& mean, const std::vector<double>& std,
                       std::pair<double, double> scale, std::pair<double, double> ratio, double flip_probability,
                       int eval_resize) {
  const size_t n = same_length({&offsets, &lengths, &seeds});
  const dlstore::OutputSpec spec = output_spec(out, n, mean, std);
  const dlstore::AugmentParams p = augment_params(train, scale, ratio, flip_probability, eval_resize);
  py::array_t<uint8_t> status(static_cast<py::ssize_t>(n));
  std::vector<dlstore::ImageError> errors;
  const ContiguousBytes bytes(buffer);
  py::array target = out;
  void* slots = target.mutable_data();  // writable: checked by output_spec
  uint8_t* status_data = status.mutable_data();
  dlstore_bindings::without_gil([&] {
    decoder.decode(bytes.data(), bytes.size(), offsets.data(), lengths.data(), seeds.data(), n, p, spec, slots,
                   status_data, &errors);
  });
  py::list failures;
  for (const dlstore::ImageError& e : errors) failures.append(py::make_tuple(e.index, e.message));
  return py::make_tuple(status, failures);
}

// -> (offsets, lengths) of bytes feature `name` in each record, relative to the start of `buffer`.
py::tuple bytes_feature_spans(py::handle buffer, const U64Array& offsets, const U64Array& lengths,
                              const std::string& name) {
  const size_t n = same_length({&offsets, &lengths});
  U64Array value_offsets(static_cast<py::ssize_t>(n)), value_lengths(static_cast<py::ssize_t>(n));
  const ContiguousBytes bytes(buffer);
  uint64_t* value_offsets_data = value_offsets.mutable_data();
  uint64_t* value_lengths_data = value_lengths.mutable_data();
  dlstore_bindings::without_gil([&] {
    dlstore::locate_bytes_feature(bytes.data(), bytes.size(), offsets.data(), lengths.data(), n, name,
                                  value_offsets_data, value_lengths_data);
  });
  return py::make_tuple(value_offsets, value_lengths);
}

}  // namespace

void register_image(py::module_& m) {
  m.def("jpeg_available", [] { return py::make_tuple(dlstore::jpeg_available(), dlstore::jpeg_build_info()); },
        "(bool, str): whether this build decodes JPEGs, and with what (or why not).");
  m.def("image_crop_windows", &crop_windows, py::arg("heights"), py::arg("widths"), py::arg("seeds"),
        py::arg("train"), py::arg("out_h"), py::arg("out_w"), py::arg("scale"), py::arg("ratio"),
        py::arg("flip_probability"), py::arg("eval_resize"),
        "Crop windows, flips and DCT scales the decoder uses; see dlstore.pipeline.decode.crop_windows.");
  m.def("example_bytes_spans", &bytes_feature_spans, py::arg("buffer"), py::arg("offsets"), py::arg("lengths"),
        py::arg("name"), "Where a one-value bytes feature lies in each record; see dlstore.formats.example.");

  py::class_<dlstore::JpegBatchDecoder>(m, "JpegDecoder")
      .def(py::init([](size_t threads, const std::string& dct_method, bool fancy_upsampling, bool window_decode,
                       unsigned dct_scales) {
             dlstore::JpegTuning t;
             t.dct_scales = dct_scales;
             t.dct_method = dlstore::parse_dct_method(dct_method);
             t.fancy_upsampling = fancy_upsampling;
             t.window_decode = window_decode;
             return std::make_unique<dlstore::JpegBatchDecoder>(threads, t);
           }),
           py::arg("threads"), py::arg("dct_method"), py::arg("fancy_upsampling"), py::arg("window_decode"),
           py::arg("dct_scales") = dlstore::kPowerOfTwoDctScales)
      .def_property_readonly("threads", &dlstore::JpegBatchDecoder::threads)
      .def("decode", &decode_batch, py::arg("buffer"), py::arg("offsets"), py::arg("lengths"), py::arg("seeds"),
           py::arg("out"), py::arg("train"), py::arg("mean"), py::arg("std"), py::arg("scale"), py::arg("ratio"),
           py::arg("flip_probability"), py::arg("eval_resize"),
           "Decodes a batch into `out`; see dlstore.pipeline.decode.decode_batch.");
}
