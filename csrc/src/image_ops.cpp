#include "dlstore/image_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dlstore/error.hpp"

namespace dlstore {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t random_bits(uint64_t seed, uint64_t counter) {
  // splitmix64 at state mix64(seed) + (counter + 1) * golden: hashing the seed first keeps the
  // streams of neighbouring seeds (image i and i + 1) from being shifted copies of each other.
  return mix64(mix64(seed) + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

double random_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(random_bits(seed, counter) >> 11) * 0x1.0p-53;
}

namespace {

// torch.randint(0, n): an integer in [0, n).
int random_below(uint64_t seed, uint64_t counter, int n) {
  const int v = static_cast<int>(random_uniform(seed, counter) * n);
  return std::min(v, n - 1);  // u * n can round up to n for u just below 1
}

// Python's int(round(x)): halves go to the even neighbour, which nearbyint does in the default
// rounding mode.
int round_half_even(double x) { return static_cast<int>(std::nearbyint(x)); }

}  // namespace

CropWindow random_resized_crop(int height, int width, uint64_t seed, const RandomResizedCropParams& p) {
  CropWindow win;
  win.flip = random_uniform(seed, kFlipCounter) < p.flip_probability;
  const double area = double(height) * double(width);
  const double log_lo = std::log(p.ratio_min), log_hi = std::log(p.ratio_max);
  for (int a = 0; a < p.attempts; ++a) {
    const uint64_t c = 4 * uint64_t(a);
    const double target = area * (p.scale_min + (p.scale_max - p.scale_min) * random_uniform(seed, c));
    const double ratio = std::exp(log_lo + (log_hi - log_lo) * random_uniform(seed, c + 1));
    const int w = round_half_even(std::sqrt(target * ratio));
    const int h = round_half_even(std::sqrt(target / ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      win.y = random_below(seed, c + 2, height - h + 1);
      win.x = random_below(seed, c + 3, width - w + 1);
      win.w = w;
      win.h = h;
      return win;
    }
  }
  // No attempt fitted: the largest centred crop whose ratio lies in the range.
  const double in_ratio = double(width) / double(height);
  int w = width, h = height;
  if (in_ratio < std::min(p.ratio_min, p.ratio_max)) {
    h = round_half_even(w / std::min(p.ratio_min, p.ratio_max));
  } else if (in_ratio > std::max(p.ratio_min, p.ratio_max)) {
    w = round_half_even(h * std::max(p.ratio_min, p.ratio_max));
  }
  win.x = (width - w) / 2;
  win.y = (height - h) / 2;
  win.w = w;
  win.h = h;
  return win;
}

CropWindow center_crop_window(int height, int width, int eval_resize, int out_h, int out_w) {
  // torchvision: the shorter side becomes eval_resize, the longer int(eval_resize * long / short).
  int resized_w = eval_resize, resized_h = eval_resize;
  if (width <= height)
    resized_h = static_cast<int>(double(eval_resize) * height / width);
  else
    resized_w = static_cast<int>(double(eval_resize) * width / height);
  const int top = round_half_even((resized_h - out_h) / 2.0);
  const int left = round_half_even((resized_w - out_w) / 2.0);
  // The resized image's pixel edges map linearly onto the original's, per axis.
  const double sx = double(width) / resized_w, sy = double(height) / resized_h;
  CropWindow win;
  win.x = left * sx;
  win.y = top * sy;
  win.w = out_w * sx;
  win.h = out_h * sy;
  return win;
}

CropWindow plan_crop(int height, int width, uint64_t seed, const AugmentParams& p, int out_h, int out_w) {
  return p.train ? random_resized_crop(height, width, seed, p.random_crop)
                 : center_crop_window(height, width, p.eval_resize, out_h, out_w);
}

int choose_dct_scale(const CropWindow& window, int out_h, int out_w, unsigned allowed) {
  // A hair of slack so that a window of exactly 2 x 224 px still takes M = 4 despite rounding.
  constexpr double kSlack = 1e-9;
  for (int m = 1; m < 8; ++m) {
    const bool covers = window.w * m >= 8.0 * out_w * (1 - kSlack) && window.h * m >= 8.0 * out_h * (1 - kSlack);
    if ((allowed >> (m - 1) & 1) && covers) return m;
  }
  return 8;
}

namespace {

// How output pixels lie on a source axis: `scale` source pixels per output pixel, the triangle
// stretched by `filter_scale` (1 when enlarging), reaching `support` pixels either side of a centre.
struct FilterGeometry {
  double scale, filter_scale, support;
};

inline FilterGeometry geometry(double length, int samples) {
  const double scale = length / samples;
  const double filter_scale = std::max(scale, 1.0);  // widened only when shrinking
  return {scale, filter_scale, filter_scale /* bilinear's support is 1 */};
}

inline double centre_of(double start, const FilterGeometry& g, int i) { return start + (i + 0.5) * g.scale; }

inline int lowest_pixel(double centre, const FilterGeometry& g) {
  return std::max(static_cast<int>(std::floor(centre - g.support + 0.5)), 0);
}

inline int end_pixel(double centre, const FilterGeometry& g, int limit) {
  return std::min(static_cast<int>(std::floor(centre + g.support + 0.5)), limit);
}

inline float triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? static_cast<float>(1.0 - x) : 0.f;
}

// Output i's taps with zero weights trimmed from both ends: [lo, hi) and the weights of lo..hi-1
// into w (unnormalised). Shared by make_axis_filter and sample_span so that the span always holds
// every tap.
inline void output_taps(double start, const FilterGeometry& g, int i, int limit, int& lo, int& hi, float* w) {
  const double centre = centre_of(start, g, i);
  lo = lowest_pixel(centre, g);
  hi = end_pixel(centre, g, limit);
  const double inv = 1.0 / g.filter_scale;
  while (lo < hi && triangle((lo - centre + 0.5) * inv) == 0.f) ++lo;
  while (hi > lo && triangle((hi - 1 - centre + 0.5) * inv) == 0.f) --hi;
  if (lo == hi) {  // cannot happen for a window inside the image; the nearest pixel stands in
    lo = std::min(std::max(static_cast<int>(centre), 0), limit - 1);
    hi = lo + 1;
    if (w) w[0] = 1.f;
    return;
  }
  if (w)
    for (int x = lo; x < hi; ++x) w[x - lo] = triangle((x - centre + 0.5) * inv);
}

}  // namespace

void make_axis_filter(double start, double length, int samples, int limit, AxisFilter& filter) {
  const FilterGeometry g = geometry(length, samples);
  int taps = 1;  // of the widest output, so that every output runs the same loop
  for (int i = 0; i < samples; ++i) {
    int lo, hi;
    output_taps(start, g, i, limit, lo, hi, nullptr);
    taps = std::max(taps, hi - lo);
  }
  filter.taps = taps;
  filter.first.resize(samples);
  filter.weights.assign(size_t(samples) * taps, 0.f);
  for (int i = 0; i < samples; ++i) {
    float* w = filter.weights.data() + size_t(i) * taps;
    int lo, hi;
    output_taps(start, g, i, limit, lo, hi, w);
    float sum = 0.f;
    for (int t = 0; t < hi - lo; ++t) sum += w[t];
    for (int t = 0; t < hi - lo; ++t) w[t] /= sum;
    filter.first[i] = lo;
  }
}

PixelSpan sample_span(double start, double length, int samples, int limit) {
  const FilterGeometry g = geometry(length, samples);
  int lo0, hi0, lo1, hi1;
  output_taps(start, g, 0, limit, lo0, hi0, nullptr);
  output_taps(start, g, samples - 1, limit, lo1, hi1, nullptr);
  // Both ends move right with i, so the first and the last output bound the span.
  return {std::min(lo0, lo1), std::max(hi0, hi1) - 1};
}

namespace {

// Four lanes in one SSE (or NEON) register through GCC's vector extension: the three channels of a
// pixel, and one lane of slack, filtered at once.
typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));

// What the loops of resample_window need, computed once per image.
struct ResampleJob {
  const uint8_t* src;  // row src_y0 of the decoded pixels
  size_t stride;
  size_t col0;  // byte offset of the first column the window reads
  int src_y0, src_end;
  const int* y_first;
  const float* y_weights;
  int ty;
  const int* x_offset;      // per output column (mirrored when flipping): float offset in `row`
  const Float4* x_weights;  // per output column, tx weights, each broadcast to 4 lanes
  int tx;
  float* row;
  int row_values;
  int out_w, out_h;
  OutputLayout layout;
  void* slot;
  Float4 scale, bias;
};

namespace kernels_baseline {
#include "resample_kernels.inc"
}  // namespace kernels_baseline

// The same loops for AVX2 + FMA, picked at run time when the CPU has them (the build cannot
// assume the machine it runs on): 8-lane byte-to-float conversion and fused multiply-adds make
// resampling faster than the baseline loops. GCC only: clang spells per-region targets differently.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace kernels_avx2 {
#include "resample_kernels.inc"
}  // namespace kernels_avx2
#pragma GCC pop_options

using RunResample = void (*)(const ResampleJob&);
RunResample pick_kernels() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? kernels_avx2::run_resample
                                                                         : kernels_baseline::run_resample;
}
const RunResample run_resample = pick_kernels();
#else
constexpr auto run_resample = kernels_baseline::run_resample;
#endif

}  // namespace

void resample_window(const PixelRows& src, const CropWindow& window, const OutputSpec& spec, void* slot,
                     ResampleScratch& scratch) {
  const int out_w = spec.width, out_h = spec.height;
  AxisFilter& fx = scratch.x;
  AxisFilter& fy = scratch.y;
  make_axis_filter(window.x, window.w, out_w, src.image_width, fx);
  make_axis_filter(window.y, window.h, out_h, src.image_height, fy);
  const PixelSpan xs = sample_span(window.x, window.w, out_w, src.image_width);
  const PixelSpan ys = sample_span(window.y, window.h, out_h, src.image_height);
  // The decoder promised these pixels; a broken promise would read outside its rows.
  DLSTORE_EXPECT(xs.first >= src.x0 && xs.last < src.x0 + src.width && ys.first >= src.y0 &&
                     ys.last < src.y0 + src.height,
                 Generic, "", -1,
                 "resample: window needs columns " << xs.first << ".." << xs.last << " and rows " << ys.first
                                                   << ".." << ys.last << ", decoded " << src.x0 << ".."
                                                   << src.x0 + src.width - 1 << " x " << src.y0 << ".."
                                                   << src.y0 + src.height - 1);
  const int tx = fx.taps;
  // Column taps in output order, mirrored when flipping, so that the stores run forwards either way.
  scratch.x_offset.resize(out_w);
  scratch.x_weights.resize(size_t(out_w) * tx * 4);
  auto* weights4 = reinterpret_cast<Float4*>(scratch.x_weights.data());
  static_assert(alignof(Float4) <= alignof(std::max_align_t), "vector allocations are aligned enough");
  for (int i = 0; i < out_w; ++i) {
    const int o = window.flip ? out_w - 1 - i : i;
    scratch.x_offset[o] = 3 * (fx.first[i] - xs.first);
    for (int t = 0; t < tx; ++t) {
      const float w = fx.weights[size_t(i) * tx + t];
      weights4[size_t(o) * tx + t] = Float4{w, w, w, w};
    }
  }
  const int row_values = 3 * xs.size();
  // Zeros after the row: an output near the right edge runs all tx taps, those past its own with
  // weight 0 (times 0, which must not be a NaN from stale memory), and the slack lane of the last
  // load reads one float further.
  const int padding = 3 * tx + 4;
  scratch.row.resize(size_t(row_values) + padding);
  std::fill(scratch.row.begin() + row_values, scratch.row.end(), 0.f);

  ResampleJob job;
  job.src = src.data;
  job.stride = src.stride;
  job.col0 = size_t(xs.first - src.x0) * 3;
  job.src_y0 = src.y0;
  job.src_end = src.y0 + src.height;
  job.y_first = fy.first.data();
  job.y_weights = fy.weights.data();
  job.ty = fy.taps;
  job.x_offset = scratch.x_offset.data();
  job.x_weights = weights4;
  job.tx = tx;
  job.row = scratch.row.data();
  job.row_values = row_values;
  job.out_w = out_w;
  job.out_h = out_h;
  job.layout = spec.layout;
  job.slot = slot;
  job.scale = Float4{spec.scale[0], spec.scale[1], spec.scale[2], 0.f};
  job.bias = Float4{spec.bias[0], spec.bias[1], spec.bias[2], 0.f};
  run_resample(job);
}

void cmyk_to_rgb_inplace(uint8_t* data, size_t stride, int width, int rows, bool inverted) {
  // x * y / 255 rounded, exact for 8-bit x and y.
  auto mul255 = [](unsigned x, unsigned y) {
    const unsigned t = x * y + 128;
    return static_cast<uint8_t>(((t >> 8) + t) >> 8);
  };
  for (int r = 0; r < rows; ++r) {
    uint8_t* p = data + size_t(r) * stride;
    // Forward in place: pixel x is read (bytes 4x..4x+3) before pixel x's RGB (3x..3x+2) is
    // written, and 3x + 2 < 4(x + 1), so no pixel is overwritten before it is read.
    for (int x = 0; x < width; ++x) {
      unsigned c = p[4 * x], m = p[4 * x + 1], y = p[4 * x + 2], k = p[4 * x + 3];
      if (!inverted) {
        c = 255 - c;
        m = 255 - m;
        y = 255 - y;
        k = 255 - k;
      }
      // Now "no ink" is 255: R = (1 - C)(1 - K) in 0..255 units.
      p[3 * x] = mul255(c, k);
      p[3 * x + 1] = mul255(m, k);
      p[3 * x + 2] = mul255(y, k);
    }
  }
}

}  // namespace dlstore
