// How bytes reach memory: the engine interface (open files, read lists of byte ranges into slots), its
// registry, and ChunkReader, a stream of large chunks over a list of files read through an engine with
// several chunks in flight on a thread pool, in file order.
#pragma once

#include <cstdint>
#include <chrono>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "dlstore/aligned_buffer.hpp"
#include "dlstore/file_handle.hpp"
#include "dlstore/thread_pool.hpp"

namespace dlstore {

class Engine;

// What reads need from dlstore/settings.py, set by the binding from ReadOptions.core(); ChunkReader and
// the plan reader raise the zeros to their minimums (64 KiB chunks, depth 1) and refuse zero threads.
struct EngineOptions {
  std::string engine = "buffered";  // a name in the engine registry (engine_names())
  size_t chunk_size = 0;  // bytes per read
  size_t depth = 0;       // chunks in flight
  size_t threads = 0;     // I/O threads
  // A chunk not read within this many seconds fails with an I/O error naming file and offset (a
  // hung NFS mount). 0: wait forever. The stuck read cannot be cancelled: its thread is abandoned.
  double timeout_s = 0;
  // Engines that keep several reads in flight in one call (io_uring): at most this many per I/O
  // thread; 0: the device's own limit (its nr_requests), at most kMaxQueueDepth.
  size_t queue_depth = 0;
  // O_DIRECT engines (direct, io_uring) read a request whose bytes the page cache holds already from
  // the cache instead of the device (OpenedFile::cache_first). Off: every read goes to the device.
  bool direct_cache = true;
};

// The most reads an engine keeps in flight per thread when the device's limit decides: past about 64
// outstanding reads per submitter, NVMe and virtio disks gain nothing but queueing delay.
constexpr size_t kMaxQueueDepth = 64;

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
  bool from_cache = false;      // an O_DIRECT file's chunk read from the page cache, which held it
  const Mapping* map = nullptr; // the mapping data lies in (mmap views; owner keeps it alive)
};

// A file opened by an engine: a descriptor or a mapping, what direct I/O needs, and the engine that
// reads it (not always the one that opened it: direct falls back to buffered per file). Shared by
// the readers and by the read tasks in flight, which own a reference each, so a task abandoned on a
// hung mount never touches a freed file or engine.
struct OpenedFile {
  std::string path;
  std::shared_ptr<const Engine> engine;    // the engine that reads this file
  std::shared_ptr<FileHandle> fh;          // engines that read a descriptor
  std::shared_ptr<Mapping> map;            // mmap
  uint64_t size = 0;
  uint32_t offset_align = 1;               // O_DIRECT: file offsets and lengths are multiples of this
  uint32_t memory_align = 1;               // O_DIRECT: buffer addresses are multiples of this
  uint32_t queue_depth = 1;                // reads in flight one call keeps on this file's device
  // O_DIRECT engines: a request whose bytes the page cache holds already is read from it, through a
  // buffered descriptor opened for that read (Engine::read_cached), not again from the device. Set at
  // open where direct_cache is on and the kernel tells this process the file's page-cache state.
  bool cache_first = false;

  // Bytes a slot needs to receive [offset, offset + len): O_DIRECT reads the whole aligned blocks
  // around the range. A slot's address is a multiple of memory_align.
  size_t slot_bytes(uint64_t offset, size_t len) const {
    return static_cast<size_t>(align_up(offset + len, offset_align) - align_down(offset, offset_align));
  }
};

// What opening needs besides the path. `chunk_size` must be a multiple of a direct file's alignment
// (else the file is read buffered); `sequential` sets a mapping's access advice.
struct OpenHints {
  size_t chunk_size = 64u << 10;
  bool sequential = true;
  bool direct_cache = true;  // EngineOptions::direct_cache
};

// One read of a list handed to Engine::read: bytes [offset, offset + len) of `file` into `slot`
// (at least file->slot_bytes(offset, len) bytes at a multiple of file->memory_align), or, with no
// slot, a view into the file's mapping (engines with views() only).
struct ReadRequest {
  const OpenedFile* file = nullptr;
  uint64_t offset = 0;
  size_t len = 0;
  uint8_t* slot = nullptr;
  // Set by the read:
  const uint8_t* data = nullptr;  // where byte `offset` is: in the slot (after the aligned lead) or the mapping
  uint64_t bytes_read = 0;        // bytes read from the file (O_DIRECT from the device: whole blocks, to the
                                  // file's end; from the page cache: the request's)
  std::exception_ptr error;       // this read failed (an Error naming file and offset); others may not have
  bool from_cache = false;        // an O_DIRECT file's request read from the page cache, which held it
};

// How bytes reach memory. An engine opens files and reads lists of byte ranges into slots the caller
// gives; both readers (ChunkReader here, the plan reader's I/O tasks) use nothing else, so a new
// engine is one .cpp with a factory plus its line in the registry (engine_registry.cpp).
// Engines are immutable once made and shared by the threads reading through them.
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  virtual ~Engine() = default;
  virtual const char* name() const = 0;
  // Opens `path` for reading. The file's `engine` says what reads it: another engine where this one
  // cannot (direct -> buffered when the filesystem refuses O_DIRECT), saying why in `note`. Touches
  // no shared state, so it may run on a thread that a hung mount never gives back.
  virtual std::shared_ptr<OpenedFile> open(const std::string& path, const OpenHints& hints,
                                           std::string* note) const = 0;
  // Reads requests [0, n), all of files this engine reads (read_all groups them so), as this engine
  // can: one after the other, or all in flight at once. A failed or short read sets its request's error and leaves the
  // others be. Returns when every request is done: no read still writes into a slot.
  virtual void read(ReadRequest* reqs, size_t n) const;
  // Whether a request without a slot gets a view of the file's bytes (a mapping) instead of a copy.
  virtual bool views() const { return false; }
  // Why this engine reads otherwise than asked on some thread (a ring the kernel refused there): notes
  // the readers report beside their per-file ones.
  virtual std::vector<std::string> notes() const { return {}; }

 protected:
  // One request by pread into its slot: whole blocks for an O_DIRECT file, then check_read.
  static void pread_one(ReadRequest& r);
  // For a file with cache_first: whether the page cache holds all of the request's bytes (one cachestat).
  static bool cache_holds(const ReadRequest& r);
  // When cache_holds (asked here unless `checked`), reads the request's bytes through a buffered descriptor
  // into the slot where O_DIRECT would put them (after the aligned block's lead), sets from_cache, and returns true;
  // otherwise (or where the path no longer opens that file) reads nothing and returns false.
  static bool read_cached(ReadRequest& r, bool checked = false);
  // Sets r.data and r.bytes_read from `got` bytes read into the slot from the aligned start, or
  // r.error when they do not cover the request (a file truncated while read).
  static void check_read(ReadRequest& r, size_t got);
};

// Reads every request through its file's engine, consecutive requests of one engine in one call.
void read_all(ReadRequest* reqs, size_t n);

// While one lives, a page of a file mapping that its file no longer holds (cut short since it was mapped),
// touched on this thread, reads as zeros instead of raising SIGBUS (a page of zeros is mapped over it), and
// lost() says so: the caller then checks the file again (Mapping::expect_holds), which names it. For code
// that reads in place in a mapping (a chunk's frames checked where they lie) and cannot stop at a signal.
class MappedTouches {
 public:
  MappedTouches();
  ~MappedTouches();
  MappedTouches(const MappedTouches&) = delete;
  MappedTouches& operator=(const MappedTouches&) = delete;
  bool lost() const;
};

// The engine registered as `opts.engine`, made for these options. An engine the kernel refuses here
// (io_uring under a seccomp filter) gives the one that replaces it, saying why in `note`. Unknown
// names are an error listing the registered ones.
std::shared_ptr<const Engine> make_engine(const EngineOptions& opts, std::string* note);
// The buffered engine, which others fall back to for a file they cannot read their way.
std::shared_ptr<const Engine> buffered_engine();
// The registered names, in registry order.
std::vector<std::string> engine_names();

// O_DIRECT for `path` with the alignment the filesystem asks for: the handle, or null with `note`
// saying why not (the filesystem refuses O_DIRECT, or asks for an alignment above 64 KiB or one that
// `chunk_size` is not a multiple of). For the engines that read O_DIRECT where it can be had.
std::shared_ptr<FileHandle> open_direct(const std::string& path, size_t chunk_size, uint32_t* offset_align,
                                        uint32_t* memory_align, std::string* note);

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
  // headroom: space before each chunk where a record's start is moved so the record becomes
  // contiguous without a separate allocation (raised to 64 KiB at least).
  ChunkReader(std::vector<std::string> paths, EngineOptions opts, size_t headroom,
              std::vector<ByteRange> ranges = {});
  ~ChunkReader() override;
  bool next(Chunk& out) override;
  // Ends the reads: those not started are dropped, those under way waited for up to the read timeout (with
  // the GIL released: see the bindings), so that the files are closed when the reader goes. One still
  // running then is abandoned, as the destructor abandons whatever it finds in flight.
  void close();
  // Notes such as "direct -> buffered for PATH: the filesystem refuses O_DIRECT", the engine's included.
  std::vector<std::string> notes() const;
  size_t note_count() const { return notes_.size() + engine_->notes().size(); }  // without copying them
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t cache_bytes_read() const { return cache_bytes_read_; }  // of those, O_DIRECT files' from the page cache
  const std::shared_ptr<BufferPool>& pool() const { return pool_; }
  const EngineOptions& options() const { return opts_; }
  size_t headroom() const { return headroom_; }

 private:
  struct OpenFile;
  void open_next_file();
  void fill();
  std::vector<std::string> paths_;
  std::vector<ByteRange> ranges_;
  EngineOptions opts_;
  size_t headroom_ = 0;
  std::shared_ptr<const Engine> engine_;
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
  uint64_t cache_bytes_read_ = 0;
};

}  // namespace dlstore
