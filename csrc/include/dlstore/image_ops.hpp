// Image geometry and pixel work of the ResNet-50 input pipeline, independent of any JPEG library:
// where to crop (torchvision's RandomResizedCrop and Resize + CenterCrop, drawn from a counter-based
// RNG), which DCT scale still covers the output, and one fused resize (torchvision's antialiased
// bilinear) + flip + uint8 copy or normalisation straight into the caller's batch slot.
//
// Coordinates: a window is a float rectangle in pixel-edge coordinates of the full-size image
// (pixel j covers [j, j + 1), its centre is j + 0.5). Output pixel i of a window [x, x + w) is
// centred at x + (i + 0.5) * w / out, as in torch's interpolate (align_corners=False) and PIL. An
// image decoded at DCT scale M/8 has pixel j covering [j * 8/M, (j + 1) * 8/M) of the full image,
// so the same window scaled by M/8 is resampled the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dlstore {

// ---- counter-based randomness ---------------------------------------------------------------------

// splitmix64's finaliser: a bijective 64-bit mix.
uint64_t mix64(uint64_t z);

// Value `counter` of the stream keyed by `seed`: a pure function of both, so an image's augmentation
// depends on its seed alone, never on which thread decoded it or what was decoded before.
uint64_t random_bits(uint64_t seed, uint64_t counter);

// Uniform double in [0, 1) from the top 53 bits of random_bits(seed, counter).
double random_uniform(uint64_t seed, uint64_t counter);

// ---- where to crop --------------------------------------------------------------------------------

struct RandomResizedCropParams {
  double scale_min = 0.08, scale_max = 1.0;            // fraction of the image area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height, drawn log-uniform
  int attempts = 10;                                   // then the centre-crop fallback
  double flip_probability = 0.5;                       // horizontal flip after the resize
};

struct AugmentParams {
  bool train = true;  // train: RandomResizedCrop + flip; eval: resize shorter side + centre crop
  RandomResizedCropParams random_crop;
  int eval_resize = 256;  // eval: the shorter side is resized to this, then the centre out_h x out_w
};

struct CropWindow {
  double x = 0, y = 0, w = 0, h = 0;  // in full-size pixel-edge coordinates
  bool flip = false;
};

// Which RNG counters each draw uses: attempt a of RandomResizedCrop takes 4a .. 4a + 3 (area, log
// ratio, top, left); the flip takes kFlipCounter. Tests re-derive crops from these.
constexpr uint64_t kFlipCounter = 1000;

// torchvision's RandomResizedCrop.get_params (integer crop) plus the flip, for an image of
// height x width; every random number comes from (seed, counter).
CropWindow random_resized_crop(int height, int width, uint64_t seed, const RandomResizedCropParams& p);

// torchvision's Resize(eval_resize) (shorter side; longer side truncated as torchvision does) then
// CenterCrop(out_h, out_w), expressed as the window of the original image that the crop shows.
CropWindow center_crop_window(int height, int width, int eval_resize, int out_h, int out_w);

CropWindow plan_crop(int height, int width, uint64_t seed, const AugmentParams& p, int out_h, int out_w);

// The smallest allowed M such that the window decoded at scale M/8 still covers out_w x out_h
// (both sides >= the output), so the resize never has to enlarge what a larger scale would have
// kept; 8 when even full size does not cover it (small crops are enlarged). `allowed` has bit
// M - 1 set for each M the decoder may use; 8 always is.
constexpr unsigned kAllDctScales = 0xff;
// libjpeg-turbo has SIMD IDCTs for 8/8 and the reduced 4/8, 2/8 and 1/8 only; 3/8, 5/8, 6/8 and
// 7/8 run plain C, and for 4:2:0 chroma 6x6 .. 14x14 IDCTs. Measured on the synthetic ImageNet
// set (one thread, ms per image, train / eval): all scales 1.45 / 1.76, powers of two 1.31 / 1.53,
// full-size decode 1.82 / 1.85. Choosing among the fast ones and leaving the rest of the
// reduction to the antialiased resize is faster and as close to Pillow's result.
constexpr unsigned kPowerOfTwoDctScales = (1u << 0) | (1u << 1) | (1u << 3) | (1u << 7);
int choose_dct_scale(const CropWindow& window, int out_h, int out_w, unsigned allowed = kPowerOfTwoDctScales);

// ---- resampling -----------------------------------------------------------------------------------

// Pixels [first, last] (inclusive) of an axis of `limit` pixels that resampling the window
// [start, start + length) to `samples` pixels reads (see AxisFilter).
struct PixelSpan {
  int first = 0, last = -1;
  int size() const { return last - first + 1; }
};
PixelSpan sample_span(double start, double length, int samples, int limit);

enum class OutputLayout : uint8_t { HwcUint8, ChwFloat32 };

struct OutputSpec {
  OutputLayout layout = OutputLayout::HwcUint8;
  int height = 224, width = 224;
  // ChwFloat32: out = value * scale[c] + bias[c] with value in 0..255, i.e. scale = 1 / (255 std),
  // bias = -mean / std for ImageNet's mean and std given in 0..1 units.
  float scale[3] = {1, 1, 1};
  float bias[3] = {0, 0, 0};

  size_t slot_bytes() const {
    const size_t values = size_t(height) * size_t(width) * 3;
    return layout == OutputLayout::HwcUint8 ? values : values * sizeof(float);
  }
};

// RGB rows of an image (possibly decoded at a DCT scale), holding at least the pixels the sampling
// touches: columns [x0, x0 + width) and rows [y0, y0 + height) of an image_width x image_height image.
struct PixelRows {
  const uint8_t* data = nullptr;
  size_t stride = 0;  // bytes from one row to the next
  int x0 = 0, y0 = 0, width = 0, height = 0;
  int image_width = 0, image_height = 0;
};

// The taps of one axis: output pixel i is the sum over t < taps of weights[i * taps + t] times
// source pixel first[i] + t (weights past an output's own taps are 0). Filled by make_axis_filter.
struct AxisFilter {
  int taps = 0;
  std::vector<int> first;
  std::vector<float> weights;
};

// PIL's (and torchvision's antialias=True) bilinear: a triangle filter widened by the reduction
// factor when shrinking, plain 2-tap bilinear when enlarging, weights renormalised at the image
// edges (which, when enlarging, equals clamping to the edge pixel). Output i is centred at
// start + (i + 0.5) * length / samples in pixel-edge coordinates.
void make_axis_filter(double start, double length, int samples, int limit, AxisFilter& filter);

// Reused across images so that the hot path allocates nothing once warm.
struct ResampleScratch {
  AxisFilter x, y;
  std::vector<int> x_offset;     // x's taps in output order (mirrored when flipping), as row offsets
  std::vector<float> x_weights;  // likewise, each weight repeated 4 times (a vector register)
  std::vector<float> row;        // one vertically filtered row of the columns the window reads
};

// Resizes `window` (in the coordinates of `src`'s image) to spec.height x spec.width, mirrored
// when `flip`, written as uint8 HWC or normalised float CHW into `slot`. One pass: each output row
// filters its source rows into scratch.row (vectorised), then its columns straight into the slot.
//
// The filter is torchvision's antialiased bilinear (AxisFilter), so a window decoded at full size
// gives what torchvision's RandomResizedCrop gives on a PIL image. At a DCT scale M/8 the IDCT has
// done part of the reduction already (an area average over 8/M pixels), and the triangle filter
// does the rest; the difference to Pillow's full-size result is measured in
// tests/unit/test_jpeg_decode.py.
void resample_window(const PixelRows& src, const CropWindow& window, const OutputSpec& spec, void* slot,
                     ResampleScratch& scratch);

// Converts decoded CMYK rows in place to RGB (the rows keep their stride). `inverted`: Adobe's
// APP14 files store CMYK inverted (255 = no ink), which is what Photoshop and Pillow write.
void cmyk_to_rgb_inplace(uint8_t* data, size_t stride, int width, int rows, bool inverted);

}  // namespace dlstore
