// How bytes reach memory: a stream of large chunks over a list of files, read by one of the engines
// with several chunks in flight on a thread pool, in file order.
#pragma once

#include <cstdint>
#include <deque>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "dlstore/aligned_buffer.hpp"
#include "dlstore/file_handle.hpp"
#include "dlstore/thread_pool.hpp"

namespace dlstore {

enum class EngineKind { Buffered, Mmap, Direct };
EngineKind parse_engine(const std::string& name);
const char* engine_name(EngineKind kind);

// The values come from dlstore/settings.py (its table holds the defaults and their reasons) through
// the binding, which sets every field; ChunkReader raises the zeros here to its minimums (64 KiB
// chunks and headroom, depth 1) and refuses zero threads.
struct EngineOptions {
  EngineKind kind = EngineKind::Buffered;
  size_t chunk_size = 0;  // bytes per read
  size_t headroom = 0;    // space before each chunk where a record's start is moved so the record
                          // becomes contiguous without a separate allocation
  size_t depth = 0;       // chunks in flight
  size_t threads = 0;     // I/O threads
  // A chunk not read within this many seconds fails with an I/O error naming file and offset (a
  // hung NFS mount). 0: wait forever. The stuck read cannot be cancelled: its thread is abandoned.
  double timeout_s = 0;
};

constexpr uint64_t kUnknownSize = ~uint64_t(0);

// Direct I/O works in whole aligned blocks: offsets, lengths and buffer addresses rounded to them.
inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }

// The bytes [start, end) of a file. end == kUnknownSize: to the end of the file. Placement reads
// shards by record ranges (from the index), so a rank reads just its share of a shard.
struct ByteRange {
  uint64_t start = 0;
  uint64_t end = kUnknownSize;
};

struct Chunk {
  std::shared_ptr<void> owner;  // keeps data alive (a pooled buffer or the file's mapping)
  uint8_t* data = nullptr;
  size_t len = 0;
  uint64_t offset = 0;          // position of data[0] in the (uncompressed) file
  uint64_t file_size = kUnknownSize;  // where the part being read ends: the file's size or its range's end
  size_t file_index = 0;        // index of the (path, range) entry
  size_t headroom = 0;          // writable bytes available before data
  bool contiguous = false;      // the bytes before data are the file's preceding bytes (mmap)
  bool last = false;            // last chunk of its file
};

// A file opened for one engine: a descriptor (buffered, direct) or a mapping (mmap), with what
// direct I/O needs. Shared by the readers and by the read tasks in flight, which own a reference
// each, so a task abandoned on a hung mount never touches a freed file.
struct OpenedFile {
  std::string path;
  EngineKind kind = EngineKind::Buffered;  // what runs: direct may have fallen back to buffered
  std::shared_ptr<FileHandle> fh;          // buffered and direct
  std::shared_ptr<Mapping> map;            // mmap
  uint64_t size = 0;
  uint32_t offset_align = 1;               // direct: file offsets and lengths are multiples of this
  uint32_t memory_align = 1;               // direct: buffer addresses are multiples of this
};

// Opens `path` for `kind`: direct falls back to buffered when the filesystem refuses O_DIRECT or
// needs an alignment above 64 KiB (or one `chunk_size` is not a multiple of), saying why in `note`.
// `sequential` sets the mapping's access advice for mmap. Touches no shared state, so it may run
// on a thread that a hung mount never gives back.
std::shared_ptr<OpenedFile> open_for_engine(const std::string& path, EngineKind kind, size_t chunk_size,
                                            std::string* note, bool sequential = true);

class ChunkStream {
 public:
  virtual ~ChunkStream() = default;
  // Next chunk in order; false at the end of the last file.
  virtual bool next(Chunk& out) = 0;
};

class ChunkReader : public ChunkStream {
 public:
  // ranges: empty (every file whole) or one per path; a path may appear several times with
  // different ranges, and consecutive entries of one path share its open file.
  ChunkReader(std::vector<std::string> paths, EngineOptions opts, std::vector<ByteRange> ranges = {});
  ~ChunkReader() override;
  bool next(Chunk& out) override;
  // Per-file notes such as "direct -> buffered: the filesystem refuses O_DIRECT".
  const std::vector<std::string>& notes() const { return notes_; }
  uint64_t bytes_read() const { return bytes_read_; }
  const std::shared_ptr<BufferPool>& pool() const { return pool_; }
  const EngineOptions& options() const { return opts_; }

 private:
  struct OpenFile;
  void open_next_file();
  void fill();
  std::vector<std::string> paths_;
  std::vector<ByteRange> ranges_;
  EngineOptions opts_;
  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ThreadPool> opener_;  // one thread for opens under a timeout, apart from the reads
                                        // so that queued reads do not count against an open's time
  std::shared_ptr<OpenFile> current_;  // file whose chunks are being scheduled
  size_t next_file_ = 0;
  struct InFlight {
    std::future<Chunk> chunk;
    std::string path;  // where the read is, for a timeout's message
    uint64_t offset = 0;
  };
  std::deque<InFlight> inflight_;
  bool failed_ = false;  // a file could not be opened: nothing after it is scheduled
  bool abandoned_ = false;  // a read timed out: its thread may never return, so it is not joined
  std::vector<std::string> notes_;
  uint64_t bytes_read_ = 0;
};

}  // namespace dlstore
