#include "dlstore/compression.hpp"

#include <zlib.h>

#include "dlstore/error.hpp"

namespace dlstore {

Compression parse_compression(const std::string& name) {
  if (name.empty() || name == "none") return Compression::None;
  if (name == "gzip" || name == "GZIP") return Compression::Gzip;
  if (name == "zlib" || name == "ZLIB") return Compression::Zlib;
  throw_error(ErrorKind::Generic, "", -1, "unknown compression '" + name + "' (none, gzip, zlib)");
}

struct InflateStream::State {
  z_stream zs{};
  bool active = false;     // zs initialised for the current file
  bool ended = false;      // Z_STREAM_END seen for the current member
  Chunk in;                // current compressed chunk
  bool have_in = false;
  bool pending_pass = false;  // `in` belongs to an uncompressed file and is passed on as is
  size_t file_index = 0;
  uint64_t out_offset = 0;    // uncompressed bytes produced for the current file
  ~State() {
    if (active) inflateEnd(&zs);
  }
};

InflateStream::InflateStream(ChunkStream& upstream, std::vector<Compression> per_file,
                             std::vector<std::string> paths, std::shared_ptr<BufferPool> pool,
                             size_t headroom)
    : up_(upstream), per_file_(std::move(per_file)), paths_(std::move(paths)), pool_(std::move(pool)),
      headroom_(headroom), st_(new State) {}

InflateStream::~InflateStream() = default;

bool InflateStream::pull_input() {
  if (!up_.next(st_->in)) return false;
  st_->have_in = true;
  return true;
}

void InflateStream::check_input() const {
  // zlib reads a compressed view (mmap) of a file that may have shrunk since it arrived: an I/O error,
  // not a SIGBUS. Once per output chunk and input chunk. (An uncompressed view goes on to the scanner,
  // which checks it where it reads it.)
  const Chunk& in = st_->in;
  if (in.map && st_->zs.avail_in > 0)
    in.map->expect_holds(in.offset + static_cast<uint64_t>(st_->zs.next_in - in.data), st_->zs.avail_in);
}

bool InflateStream::next(Chunk& out) {
  State& s = *st_;
  if (pending_error_) {  // raised after the bytes inflated before it were delivered
    std::exception_ptr e = pending_error_;
    pending_error_ = nullptr;
    std::rethrow_exception(e);
  }
  for (;;) {
    if (!s.have_in && !pull_input()) {
      if (s.active && !s.ended)
        throw_error(ErrorKind::Corrupt, paths_[s.file_index], static_cast<int64_t>(s.out_offset),
                    "truncated compressed stream: the file ends before the end of its deflate data (uncompressed byte " +
                        std::to_string(s.out_offset) + ")");
      return false;
    }
    Chunk& in = s.in;
    if (per_file_[in.file_index] == Compression::None) {
      out = std::move(in);
      s.have_in = false;
      return true;
    }
    if (!s.active || s.file_index != in.file_index) {
      if (s.active) {
        if (!s.ended)
          throw_error(ErrorKind::Corrupt, paths_[s.file_index], static_cast<int64_t>(s.out_offset),
                      "truncated compressed stream: the file ends before the end of its deflate data (uncompressed byte " +
                        std::to_string(s.out_offset) + ")");
        inflateEnd(&s.zs);
        s.active = false;
      }
      s.zs = z_stream{};
      // 16+: gzip wrapper; plain window bits: zlib wrapper.
      int bits = per_file_[in.file_index] == Compression::Gzip ? 16 + MAX_WBITS : MAX_WBITS;
      if (inflateInit2(&s.zs, bits) != Z_OK)
        throw_error(ErrorKind::Generic, paths_[in.file_index], 0, "inflateInit2 failed");
      s.active = true;
      s.ended = false;
      s.file_index = in.file_index;
      s.out_offset = 0;
      s.zs.next_in = in.data;
      s.zs.avail_in = static_cast<uInt>(in.len);
    }
    check_input();
    // Fill one output chunk.
    std::shared_ptr<AlignedBuffer> buf = pool_->acquire();
    size_t cap = buf->size() - headroom_;
    uint8_t* dst = buf->data() + headroom_;
    s.zs.next_out = dst;
    s.zs.avail_out = static_cast<uInt>(cap);
    bool file_done = false;
    // Hands the bytes inflated so far to the consumer as one chunk of the uncompressed stream.
    auto emit = [&](size_t produced, bool last) {
      out = Chunk{};
      out.owner = buf;
      out.data = dst;
      out.len = produced;
      out.offset = s.out_offset;
      out.file_size = kUnknownSize;
      out.file_index = s.file_index;
      out.headroom = headroom_;
      out.last = last;
      s.out_offset += produced;
    };
    // An error keeps what was inflated before it: that chunk goes out first (not marked last, so
    // its complete records are delivered) and the error is raised by the next call. Offsets in
    // these errors are positions in the uncompressed stream, as for every record error.
    auto fail = [&](const std::string& what) {
      const size_t produced = cap - s.zs.avail_out;
      Error e = located_error(ErrorKind::Corrupt, paths_[s.file_index],
                              static_cast<int64_t>(s.out_offset + produced), what);
      inflateEnd(&s.zs);
      s.active = false;
      s.have_in = false;
      if (produced == 0) throw e;
      pending_error_ = std::make_exception_ptr(e);
      emit(produced, false);
    };
    while (s.zs.avail_out > 0) {
      if (s.zs.avail_in == 0) {
        if (in.last) {
          file_done = true;
          break;
        }
        if (!pull_input() || s.in.file_index != s.file_index) {
          fail("compressed stream ended early");
          return true;
        }
        s.zs.next_in = s.in.data;
        s.zs.avail_in = static_cast<uInt>(s.in.len);
        check_input();
      }
      if (s.ended) {
        // Concatenated gzip members (as `cat a.gz b.gz` makes) continue the same stream.
        if (inflateReset(&s.zs) != Z_OK)
          throw_error(ErrorKind::Generic, paths_[s.file_index], -1, "inflateReset failed");
        s.ended = false;
      }
      int r = inflate(&s.zs, Z_NO_FLUSH);
      if (r == Z_STREAM_END) {
        s.ended = true;
        if (s.zs.avail_in == 0 && s.in.last) {
          file_done = true;
          break;
        }
        continue;
      }
      if (r == Z_BUF_ERROR) continue;  // needs more input; the loop fetches it
      if (r != Z_OK) {
        // Where zlib stopped: the damage is there or before it (a deflate stream is found bad where its
        // bits stop making sense; a gzip trailer's CRC once its 4 bytes are read).
        const uint64_t found_at = s.in.offset + (s.in.len - s.zs.avail_in);
        fail("corrupt compressed data, found at compressed byte " + std::to_string(found_at) + " of the file: " +
             (s.zs.msg ? s.zs.msg : "inflate error " + std::to_string(r)));
        return true;
      }
    }
    size_t produced = cap - s.zs.avail_out;
    if (file_done) {
      if (!s.ended) {
        fail("truncated compressed stream: the file ends at compressed byte " + std::to_string(s.in.offset + s.in.len) +
             ", before the end of its deflate data (uncompressed byte " +
             std::to_string(s.out_offset + (cap - s.zs.avail_out)) + ")");
        return true;
      }
      inflateEnd(&s.zs);
      s.active = false;
      s.have_in = false;
    }
    emit(produced, file_done);
    if (produced > 0 || file_done) return true;
  }
}

}  // namespace dlstore
