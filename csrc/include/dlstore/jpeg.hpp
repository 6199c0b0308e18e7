// Batch JPEG decode for the ResNet-50 pipeline with libjpeg(-turbo), found at build time
// (DLSTORE_HAVE_JPEG). Each image is decoded only where its crop lies, at the smallest DCT scale
// M/8 that still covers the output (of those libjpeg-turbo has SIMD code for: see
// choose_dct_scale), then resized, flipped and written (uint8 HWC or normalised float CHW) into its
// slot of a caller-owned batch array, many images at once on a small thread pool.
//
// Per image: read the header; pick the crop (image_ops.hpp, a pure function of the image's seed);
// pick M; start decompressing at M/8; jpeg_crop_scanline to the columns the bilinear taps touch
// (libjpeg widens them to iMCU boundaries, which the resampler accounts for); jpeg_skip_scanlines
// to the first row; read only the window's rows; jpeg_abort_decompress without decoding the rest.
// libjpeg's errors longjmp back to the decoder, which reports them per image; its warnings are
// silenced, except those that mean the data ran out or is garbled (see jpeg.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dlstore/image_ops.hpp"

namespace dlstore {


// Whether this build decodes JPEGs, and a sentence saying with what (or why not).
bool jpeg_available();
std::string jpeg_build_info();

enum class DctMethod : uint8_t { IntegerSlow, IntegerFast, Float };  // libjpeg's JDCT_ISLOW/IFAST/FLOAT
DctMethod parse_dct_method(const std::string& name);

struct JpegTuning {
  DctMethod dct_method = DctMethod::IntegerSlow;
  bool fancy_upsampling = true;
  unsigned dct_scales = kPowerOfTwoDctScales;  // which M/8 scales choose_dct_scale may pick
  // false: decode the whole image at full size, then resample the same window. Only for measuring
  // what window decoding saves, and as a cross-check in the tests.
  bool window_decode = true;
};

enum class ImageStatus : uint8_t { Ok = 0, Failed = 1 };

struct ImageError {
  size_t index;
  std::string message;
};

// Per-image state of one worker (libjpeg's decompressor and the scratch rows), reused across images.
class JpegWorker;

class JpegBatchDecoder {
 public:
  JpegBatchDecoder(size_t threads, JpegTuning tuning);
  ~JpegBatchDecoder();
  JpegBatchDecoder(const JpegBatchDecoder&) = delete;
  JpegBatchDecoder& operator=(const JpegBatchDecoder&) = delete;

  size_t threads() const { return workers_.size(); }

  // Image i is buffer[offsets[i], offsets[i] + lengths[i]), augmented with seeds[i]; its output goes
  // to out + i * spec.slot_bytes(). A failed image gets status Failed, an all-zero slot and an entry
  // in `errors` (sorted by index) with libjpeg's message; the others are unaffected. Throws only for
  // arguments that are wrong for the whole batch (a span outside the buffer). Calls from several
  // threads take turns.
  void decode(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets, const uint64_t* lengths,
              const uint64_t* seeds, size_t n, const AugmentParams& augment, const OutputSpec& spec, void* out,
              uint8_t* status, std::vector<ImageError>* errors);

 private:
  std::vector<std::unique_ptr<JpegWorker>> workers_;  // worker 0 runs on the calling thread, the rest
                                                      // on helpers of the process pool
  std::mutex mu_;
};

}  // namespace dlstore
