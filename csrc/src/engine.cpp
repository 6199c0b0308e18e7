#include "dlstore/engine.hpp"

#include "dlstore/error.hpp"

namespace dlstore {

EngineKind parse_engine(const std::string& name) {
  if (name == "buffered") return EngineKind::Buffered;
  if (name == "mmap") return EngineKind::Mmap;
  if (name == "direct") return EngineKind::Direct;
  throw_error(ErrorKind::Generic, "", -1, "unknown I/O engine '" + name + "' (buffered, mmap, direct)");
}

const char* engine_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::Buffered: return "buffered";
    case EngineKind::Mmap: return "mmap";
    case EngineKind::Direct: return "direct";
  }
  return "?";
}

// One (path, range) entry being read: the opened file (shared by consecutive entries of one path)
// and how far its reads have been queued.
struct ChunkReader::OpenFile {
  size_t index = 0;
  std::shared_ptr<OpenedFile> file;
  uint64_t start = 0;              // the range being read: [start, end)
  uint64_t end = 0;
  uint64_t scheduled = 0;          // the offset up to which reads have been queued
};


ChunkReader::ChunkReader(std::vector<std::string> paths, EngineOptions opts, std::vector<ByteRange> ranges)
    : paths_(std::move(paths)), ranges_(std::move(ranges)), opts_(opts) {
  if (ranges_.empty()) ranges_.resize(paths_.size());
  DLSTORE_EXPECT(ranges_.size() == paths_.size(), Generic, "", -1,
                 "internal: " << ranges_.size() << " byte ranges for " << paths_.size() << " files");
  // Chunks and headroom stay multiples of 64 KiB so that every direct-I/O alignment seen in
  // practice (512 B .. 64 KiB) holds for offsets, lengths and buffer addresses alike.
  constexpr size_t kGrain = 64u << 10;
  opts_.chunk_size = align_up(std::max<size_t>(opts_.chunk_size, kGrain), kGrain);
  opts_.headroom = align_up(std::max<size_t>(opts_.headroom, kGrain), kGrain);
  if (opts_.depth == 0) opts_.depth = 1;
  DLSTORE_EXPECT(opts_.threads > 0, Generic, "", -1, "internal: a reader needs at least one I/O thread");
  pool_ = BufferPool::shared(opts_.headroom + opts_.chunk_size, kGrain);
  threads_.reset(new ThreadPool(opts_.threads));
}

ChunkReader::~ChunkReader() {
  if (abandoned_) {
    // A read is stuck in the kernel (a hung mount). Joining its thread would hang this destructor,
    // so the pool and its threads are leaked on purpose; each queued task owns what it touches
    // (file, buffer) through shared pointers, so nothing it uses is freed under it.
    threads_.release();
    opener_.release();
    return;
  }
  // Let queued reads finish before their file handles and the pool go away.
  for (auto& f : inflight_) {
    try {
      f.chunk.wait();
    } catch (...) {
    }
  }
}

std::shared_ptr<OpenedFile> open_for_engine(const std::string& path, EngineKind kind, size_t chunk_size,
                                            std::string* note, bool sequential) {
  auto of = std::make_shared<OpenedFile>();
  of->path = path;
  of->kind = kind;
  if (kind == EngineKind::Mmap) {
    of->map = std::make_shared<Mapping>(path, sequential);
    of->size = of->map->size();
    return of;
  }
  if (kind == EngineKind::Direct) {
    try {
      of->fh = std::make_shared<FileHandle>(path, true);
      DirectAlignment a = of->fh->direct_alignment();
      if (!a.supported) {
        *note = std::string("direct -> buffered for ") + path + ": " + a.source +
                " reports that this file cannot do direct I/O";
        of->fh.reset();
      } else if (a.memory > (64u << 10) || a.offset > (64u << 10) || chunk_size % a.offset != 0) {
        *note = std::string("direct -> buffered for ") + path + ": alignment " + std::to_string(a.offset) +
                " from " + a.source + " is larger than supported";
        of->fh.reset();
      } else {
        of->offset_align = a.offset;
        of->memory_align = a.memory;
      }
    } catch (const Error& e) {
      if (e.kind != ErrorKind::Alignment) throw;
      *note = std::string("direct -> buffered for ") + path + ": " + e.what();
    }
    if (!of->fh) of->kind = EngineKind::Buffered;
  }
  if (!of->fh) of->fh = std::make_shared<FileHandle>(path, false);
  of->size = of->fh->size();
  return of;
}

void ChunkReader::open_next_file() {
  const size_t index = next_file_;
  const std::string& path = paths_[index];
  const ByteRange range = ranges_[next_file_++];
  auto of = std::make_shared<OpenFile>();
  if (current_ && current_->file->path == path) {
    // The next range of the same file (records of one shard split into pieces): share the open
    // file or mapping instead of opening and mapping it again.
    of->file = current_->file;
  } else if (opts_.timeout_s > 0) {
    // A hung mount blocks open() and fstat() as well as reads: open on a thread of its own and wait
    // at most the timeout. The task owns copies of what it uses, so an abandoned one touches nothing
    // of this reader.
    auto note = std::make_shared<std::string>();
    const EngineKind kind = opts_.kind;
    const size_t chunk_size = opts_.chunk_size;
    if (!opener_) opener_.reset(new ThreadPool(1));
    std::future<std::shared_ptr<OpenedFile>> opened = opener_->submit(
        [path, kind, chunk_size, note]() { return open_for_engine(path, kind, chunk_size, note.get()); });
    if (opened.wait_for(std::chrono::duration<double>(opts_.timeout_s)) != std::future_status::ready) {
      abandoned_ = true;
      throw_error(ErrorKind::Io, path, -1,
                  "open timed out: the file did not open within " + std::to_string(opts_.timeout_s) +
                      " s (a hung or very slow mount?)");
    }
    of->file = opened.get();
    if (!note->empty()) notes_.push_back(*note);
  } else {
    std::string note;
    of->file = open_for_engine(path, opts_.kind, opts_.chunk_size, &note);
    if (!note.empty()) notes_.push_back(note);
  }
  of->index = index;
  of->start = range.start;
  const uint64_t size = of->file->size;
  of->end = range.end == kUnknownSize ? size : range.end;
  DLSTORE_EXPECT(of->start <= of->end && of->end <= size, Io, path, static_cast<int64_t>(of->start),
                 "byte range [" << range.start << ", " << of->end << ") is outside the file of " << size
                                << " bytes (did the file change since its index was made?)");
  of->scheduled = of->start;
  current_ = of;
}

void ChunkReader::fill() {
  while (inflight_.size() < opts_.depth && !failed_) {
    if (!current_ || current_->scheduled >= current_->end) {
      if (next_file_ >= paths_.size()) return;
      try {
        open_next_file();
      } catch (...) {
        // Queued behind the chunks already in flight, so the consumer gets every chunk of the
        // earlier files first and this error where it belongs in file order.
        std::promise<Chunk> failed;
        failed.set_exception(std::current_exception());
        inflight_.push_back({failed.get_future(), paths_[next_file_ - 1], 0});
        failed_ = true;
        return;
      }
      if (current_->start == current_->end) continue;  // an empty file or range has no records
    }
    std::shared_ptr<OpenFile> of = current_;
    const std::shared_ptr<OpenedFile> file = of->file;
    uint64_t offset = of->scheduled;
    // Direct reads start at aligned offsets, so a range starting mid-block makes its first chunk
    // shorter by the part of the block before it: every later chunk then starts aligned and the
    // whole-block read of any chunk fits in chunk_size.
    uint64_t chunk_end = file->kind == EngineKind::Direct ? align_down(offset, file->offset_align) + opts_.chunk_size
                                                          : offset + opts_.chunk_size;
    size_t len = static_cast<size_t>(std::min<uint64_t>(chunk_end, of->end) - offset);
    of->scheduled += len;
    bool last = of->scheduled >= of->end;
    size_t headroom = opts_.headroom;
    std::shared_ptr<BufferPool> pool = pool_;
    const uint64_t range_start = of->start, range_end = of->end;
    const size_t index = of->index;
    inflight_.push_back({threads_->submit([file, range_start, range_end, index, offset, len, last, headroom,
                                           pool]() -> Chunk {
      Chunk c;
      c.offset = offset;
      c.len = len;
      c.file_size = range_end;  // the scanner treats the range's end as the end of the file
      c.file_index = index;
      c.last = last;
      if (file->kind == EngineKind::Mmap) {
        file->map->populate(offset, len);
        c.owner = file->map;
        c.data = const_cast<uint8_t*>(file->map->data()) + offset;  // read-only: headroom stays 0
        c.contiguous = offset > range_start;
        return c;
      }
      std::shared_ptr<AlignedBuffer> buf = pool->acquire();
      // O_DIRECT reads whole aligned blocks into an aligned address: the read starts at the block
      // holding `offset`, and the bytes before `offset` widen the headroom. The file's unaligned
      // tail comes back as a short read.
      const bool direct = file->kind == EngineKind::Direct;
      const uint64_t read_at = direct ? align_down(offset, file->offset_align) : offset;
      const size_t lead = static_cast<size_t>(offset - read_at);
      uint8_t* dst = buf->data() + headroom;
      size_t want = direct ? align_up(lead + len, file->offset_align) : len;
      size_t got = file->fh->pread_full(dst, want, read_at);
      DLSTORE_EXPECT(got >= lead + len, Io, file->fh->path(), static_cast<int64_t>(read_at + got),
                     "short read: expected " << len << " bytes at offset " << offset << ", got "
                                             << (got > lead ? got - lead : 0)
                                             << " (was the file truncated while being read?)");
      c.data = dst + lead;
      c.headroom = headroom + lead;
      c.owner = buf;
      return c;
    }), file->path, offset});
  }
}

bool ChunkReader::next(Chunk& out) {
  fill();
  if (inflight_.empty()) return false;
  InFlight& front = inflight_.front();
  if (opts_.timeout_s > 0 &&
      front.chunk.wait_for(std::chrono::duration<double>(opts_.timeout_s)) != std::future_status::ready) {
    abandoned_ = true;
    failed_ = true;
    throw_error(ErrorKind::Io, front.path, static_cast<int64_t>(front.offset),
                "read timed out: no data within " + std::to_string(opts_.timeout_s) +
                    " s (a hung or very slow mount?)");
  }
  std::future<Chunk> f = std::move(front.chunk);
  inflight_.pop_front();
  out = f.get();  // rethrows a read error with its file and offset
  bytes_read_ += out.len;
  fill();
  return true;
}

}  // namespace dlstore
