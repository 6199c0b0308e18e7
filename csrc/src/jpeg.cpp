#include "dlstore/jpeg.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>

#include "dlstore/error.hpp"
#include "dlstore/thread_pool.hpp"

#ifdef DLSTORE_HAVE_JPEG
#include <csetjmp>
#include <cstdio>  // jpeglib.h uses FILE without including stdio.h

#include <jpeglib.h>
// jerror.h after jpeglib.h: the message codes, to tell warnings that mean lost data from harmless ones.
#include <jerror.h>
#endif

namespace dlstore {

DctMethod parse_dct_method(const std::string& name) {
  if (name == "islow") return DctMethod::IntegerSlow;
  if (name == "ifast") return DctMethod::IntegerFast;
  if (name == "float") return DctMethod::Float;
  throw Error(ErrorKind::Generic, "unknown DCT method '" + name + "' (islow, ifast or float)");
}

#ifdef DLSTORE_HAVE_JPEG

#define DLSTORE_STR_(x) #x
#define DLSTORE_STR(x) DLSTORE_STR_(x)

bool jpeg_available() { return true; }

std::string jpeg_build_info() {
#ifdef LIBJPEG_TURBO_VERSION
  return "libjpeg-turbo " DLSTORE_STR(LIBJPEG_TURBO_VERSION) " (libjpeg API " DLSTORE_STR(JPEG_LIB_VERSION) ")";
#else
  return "libjpeg (API " DLSTORE_STR(JPEG_LIB_VERSION) ")";
#endif
}

namespace {

// Images whose decoded window would need more than this are refused rather than allocated: a
// header can claim 65,500 x 65,500 pixels in a few hundred bytes.
constexpr size_t kMaxWindowBytes = size_t(512) << 20;

// libjpeg reports errors through error_exit, which must not return. It longjmps back to the
// setjmp in JpegWorker::read_window; only libjpeg's C frames and that function's trivially
// destructible locals lie between, so no C++ destructor is skipped. (Throwing through libjpeg's C
// frames instead would rely on it being built with unwind tables.)
struct ErrorManager {
  jpeg_error_mgr pub;  // first member: libjpeg hands back a jpeg_error_mgr*, cast to this
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings go nowhere (libjpeg would print them to stderr), except those that mean the pixels are
// not the image's: data that ran out (a truncated file) or entropy-coded data that does not decode.
// Those fail the image, as Pillow's "image file is truncated" does; a truncated file whose missing
// part lies below the crop window is never read that far, and decodes. Extraneous bytes before a
// marker (a few of ImageNet's files have them) are harmless and stay a warning.
void on_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
      on_error_exit(cinfo);
    default:
      cinfo->err->num_warnings++;
  }
}

J_DCT_METHOD to_libjpeg(DctMethod m) {
  switch (m) {
    case DctMethod::IntegerFast: return JDCT_IFAST;
    case DctMethod::Float: return JDCT_FLOAT;
    default: return JDCT_ISLOW;
  }
}

}  // namespace

class JpegWorker {
 public:
  explicit JpegWorker(const JpegTuning& tuning) : tuning_(tuning) {
    std::memset(&err_, 0, sizeof(err_));
    jpeg_std_error(&err_.pub);
    err_.pub.error_exit = on_error_exit;
    err_.pub.emit_message = on_emit_message;
    cinfo_.err = &err_.pub;
    if (setjmp(err_.jump)) throw Error(ErrorKind::Generic, std::string("libjpeg: ") + err_.message);
    jpeg_create_decompress(&cinfo_);
  }
  ~JpegWorker() { jpeg_destroy_decompress(&cinfo_); }
  JpegWorker(const JpegWorker&) = delete;
  JpegWorker& operator=(const JpegWorker&) = delete;

  // Decodes one image into `slot`. False on a libjpeg error, with message(); the slot is then untouched.
  bool decode(const uint8_t* data, size_t size, uint64_t seed, const AugmentParams& augment,
              const OutputSpec& spec, void* slot) {
    bool ok;
    try {
      ok = read_window(data, size, seed, augment, spec);
    } catch (...) {  // e.g. bad_alloc growing the rows: leave libjpeg ready for the next image
      jpeg_abort_decompress(&cinfo_);
      throw;
    }
    if (ok) resample_window(rows_view_, window_, spec, slot, scratch_);
    return ok;
  }

  const char* message() const { return err_.message; }

 private:
  // Decodes the rows and columns that the resize filter's taps touch into pixels_ and sets
  // rows_view_ and window_ (in the coordinates of the scaled image). Only trivially destructible
  // locals live past the setjmp, so that a longjmp back to it skips no destructor.
  bool read_window(const uint8_t* data, size_t size, uint64_t seed, const AugmentParams& augment,
                   const OutputSpec& spec) {
    if (setjmp(err_.jump)) {
      jpeg_abort_decompress(&cinfo_);
      return false;
    }
    jpeg_mem_src(&cinfo_, data, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo_, TRUE);

    const int width = static_cast<int>(cinfo_.image_width), height = static_cast<int>(cinfo_.image_height);
    const CropWindow full = plan_crop(height, width, seed, augment, spec.height, spec.width);
    const int m = tuning_.window_decode ? choose_dct_scale(full, spec.height, spec.width, tuning_.dct_scales) : 8;

    // CMYK and YCCK (Adobe) files: libjpeg converts YCCK to CMYK, and CMYK -> RGB is done here.
    const bool cmyk = cinfo_.jpeg_color_space == JCS_CMYK || cinfo_.jpeg_color_space == JCS_YCCK;
    cinfo_.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;  // grayscale -> RGB is libjpeg's
    cinfo_.scale_num = static_cast<unsigned>(m);
    cinfo_.scale_denom = 8;
    cinfo_.dct_method = to_libjpeg(tuning_.dct_method);
    cinfo_.do_fancy_upsampling = tuning_.fancy_upsampling ? TRUE : FALSE;
    jpeg_start_decompress(&cinfo_);

    // At scale m/8 scaled pixel j covers [j * 8/m, (j + 1) * 8/m) of the original.
    const double s = m / 8.0;
    window_ = CropWindow{full.x * s, full.y * s, full.w * s, full.h * s, full.flip};
    const int scaled_w = static_cast<int>(cinfo_.output_width), scaled_h = static_cast<int>(cinfo_.output_height);
    PixelSpan xs{0, scaled_w - 1}, ys{0, scaled_h - 1};
    if (tuning_.window_decode) {
      xs = sample_span(window_.x, window_.w, spec.width, scaled_w);
      ys = sample_span(window_.y, window_.h, spec.height, scaled_h);
    }

    // libjpeg moves xoffset down and widens the width to whole iMCUs; the rows hold what it returns.
    JDIMENSION x0 = static_cast<JDIMENSION>(xs.first), columns = static_cast<JDIMENSION>(xs.size());
    if (columns < cinfo_.output_width)
      jpeg_crop_scanline(&cinfo_, &x0, &columns);
    else
      x0 = 0;
    if (ys.first > 0 && jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(ys.first)) !=
                            static_cast<JDIMENSION>(ys.first))
      return fail("could not skip to the crop window's first row");

    const int channels = cinfo_.output_components;
    const size_t stride = size_t(columns) * size_t(channels);
    const size_t rows = static_cast<size_t>(ys.size());
    if (rows * stride > kMaxWindowBytes) {
      std::snprintf(err_.message, sizeof(err_.message), "the crop window at scale %d/8 would take %zu bytes "
                    "(image %d x %d), more than the %zu allowed", m, rows * stride, width, height,
                    kMaxWindowBytes);
      return fail(nullptr);
    }
    // Grows to the largest window seen, then stays: no allocation per image once warm.
    if (pixels_.size() < rows * stride) pixels_.resize(rows * stride);
    if (rows_.size() < rows) rows_.resize(rows);
    for (size_t r = 0; r < rows; ++r) rows_[r] = pixels_.data() + r * stride;
    size_t done = 0;
    while (done < rows) {
      const JDIMENSION got = jpeg_read_scanlines(&cinfo_, rows_.data() + done, static_cast<JDIMENSION>(rows - done));
      if (got == 0) return fail("libjpeg returned no scanline");  // a memory source never suspends
      done += got;
    }
    if (cmyk) cmyk_to_rgb_inplace(pixels_.data(), stride, static_cast<int>(columns), static_cast<int>(rows),
                                  cinfo_.saw_Adobe_marker);
    // The rows below the window are never decoded.
    jpeg_abort_decompress(&cinfo_);

    rows_view_.data = pixels_.data();
    rows_view_.stride = stride;
    rows_view_.x0 = static_cast<int>(x0);
    rows_view_.width = static_cast<int>(columns);
    rows_view_.y0 = ys.first;
    rows_view_.height = static_cast<int>(rows);
    rows_view_.image_width = scaled_w;
    rows_view_.image_height = scaled_h;
    return true;
  }

  bool fail(const char* what) {
    if (what) std::snprintf(err_.message, sizeof(err_.message), "%s", what);
    jpeg_abort_decompress(&cinfo_);
    return false;
  }

  ErrorManager err_;
  jpeg_decompress_struct cinfo_;
  JpegTuning tuning_;
  std::vector<uint8_t> pixels_;
  std::vector<JSAMPROW> rows_;
  PixelRows rows_view_;
  CropWindow window_;
  ResampleScratch scratch_;
};

#else  // built without libjpeg

bool jpeg_available() { return false; }
std::string jpeg_build_info() {
  return "dlstore._C was built without JPEG decoding: jpeglib.h and libjpeg(-turbo) were not found at build "
         "time (Debian/Ubuntu: apt-get install libjpeg62-turbo-dev, then rebuild)";
}

class JpegWorker {
 public:
  bool decode(const uint8_t*, size_t, uint64_t, const AugmentParams&, const OutputSpec&, void*) { return false; }
  const char* message() const { return "no JPEG decoder in this build"; }
};

#endif

JpegBatchDecoder::JpegBatchDecoder(size_t threads, JpegTuning tuning) {
  if (!jpeg_available()) throw Error(ErrorKind::Generic, jpeg_build_info());
  if (threads == 0) threads = 1;
  workers_.reserve(threads);
#ifdef DLSTORE_HAVE_JPEG
  for (size_t t = 0; t < threads; ++t) workers_.push_back(std::make_unique<JpegWorker>(tuning));
#endif
}

JpegBatchDecoder::~JpegBatchDecoder() = default;

void JpegBatchDecoder::decode(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets,
                              const uint64_t* lengths, const uint64_t* seeds, size_t n,
                              const AugmentParams& augment, const OutputSpec& spec, void* out, uint8_t* status,
                              std::vector<ImageError>* errors) {
  for (size_t i = 0; i < n; ++i) {
    DLSTORE_EXPECT(offsets[i] <= buffer_size && lengths[i] <= buffer_size - offsets[i], Generic, "", -1,
                   "image " << i << ": bytes [" << offsets[i] << ", " << offsets[i] + lengths[i]
                            << ") lie outside the buffer of " << buffer_size << " bytes");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const size_t slot_bytes = spec.slot_bytes();
  std::atomic<size_t> next{0};
  std::mutex errors_mu;

  // Images are handed out one at a time: decode cost varies several-fold with the crop and scale.
  auto work = [&](size_t t) {
    JpegWorker& worker = *workers_[t];
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      uint8_t* slot = static_cast<uint8_t*>(out) + i * slot_bytes;
      bool ok = false;
      std::string failure;  // empty: no allocation on the good path
      try {
        ok = worker.decode(buffer + offsets[i], lengths[i], seeds[i], augment, spec, slot);
        if (!ok) failure = worker.message();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      status[i] = static_cast<uint8_t>(ok ? ImageStatus::Ok : ImageStatus::Failed);
      if (!ok) {
        std::memset(slot, 0, slot_bytes);
        std::lock_guard<std::mutex> g(errors_mu);
        errors->push_back({i, std::move(failure)});
      }
    }
  };

  // Helpers from the process-wide pool, which a forked child (a DataLoader worker) replaces with its own.
  std::vector<std::future<void>> helpers;
  if (workers_.size() > 1) {
    const std::shared_ptr<ThreadPool> pool = process_pool(workers_.size() - 1);
    for (size_t t = 1; t < workers_.size(); ++t) helpers.push_back(pool->submit([&work, t] { work(t); }));
  }
  std::exception_ptr first;
  try {
    work(0);
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& h : helpers) {  // every helper is waited for before the locals they use go away
    try {
      h.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  std::sort(errors->begin(), errors->end(), [](const ImageError& a, const ImageError& b) { return a.index < b.index; });
}

}  // namespace dlstore
