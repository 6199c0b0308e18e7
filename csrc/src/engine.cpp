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

struct ChunkReader::OpenFile {
  size_t index = 0;
  EngineKind kind = EngineKind::Buffered;
  std::shared_ptr<FileHandle> fh;  // buffered and direct
  std::shared_ptr<Mapping> map;    // mmap
  uint64_t size = 0;
  uint64_t scheduled = 0;          // bytes whose read has been queued
  uint32_t offset_align = 1;
};

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

ChunkReader::ChunkReader(std::vector<std::string> paths, EngineOptions opts)
    : paths_(std::move(paths)), opts_(opts) {
  // Chunks and headroom stay multiples of 64 KiB so that every direct-I/O alignment seen in
  // practice (512 B .. 64 KiB) holds for offsets, lengths and buffer addresses alike.
  constexpr size_t kGrain = 64u << 10;
  opts_.chunk_size = align_up(std::max<size_t>(opts_.chunk_size, kGrain), kGrain);
  opts_.headroom = align_up(std::max<size_t>(opts_.headroom, kGrain), kGrain);
  if (opts_.depth == 0) opts_.depth = 1;
  pool_ = BufferPool::shared(opts_.headroom + opts_.chunk_size, kGrain);
  threads_.reset(new ThreadPool(opts_.threads));
}

ChunkReader::~ChunkReader() {
  // Let queued reads finish before their file handles and the pool go away.
  for (auto& f : inflight_) {
    try {
      f.wait();
    } catch (...) {
    }
  }
}

void ChunkReader::open_next_file() {
  auto of = std::make_shared<OpenFile>();
  of->index = next_file_;
  const std::string& path = paths_[next_file_++];
  of->kind = opts_.kind;
  if (of->kind == EngineKind::Mmap) {
    of->map = std::make_shared<Mapping>(path);
    of->size = of->map->size();
  } else {
    if (of->kind == EngineKind::Direct) {
      try {
        of->fh = std::make_shared<FileHandle>(path, true);
        DirectAlignment a = of->fh->direct_alignment();
        if (!a.supported) {
          notes_.push_back(std::string("direct -> buffered for ") + path + ": " + a.source +
                           " reports that this file cannot do direct I/O");
          of->fh.reset();
        } else if (a.memory > (64u << 10) || a.offset > (64u << 10) || opts_.chunk_size % a.offset != 0) {
          notes_.push_back(std::string("direct -> buffered for ") + path + ": alignment " +
                           std::to_string(a.offset) + " from " + a.source + " is larger than supported");
          of->fh.reset();
        } else {
          of->offset_align = a.offset;
        }
      } catch (const Error& e) {
        if (e.kind != ErrorKind::Alignment) throw;
        notes_.push_back(std::string("direct -> buffered for ") + path + ": " + e.what());
      }
      if (!of->fh) of->kind = EngineKind::Buffered;
    }
    if (!of->fh) of->fh = std::make_shared<FileHandle>(path, false);
    of->size = of->fh->size();
  }
  current_ = of;
}

void ChunkReader::fill() {
  while (inflight_.size() < opts_.depth && !failed_) {
    if (!current_ || current_->scheduled >= current_->size) {
      if (next_file_ >= paths_.size()) return;
      try {
        open_next_file();
      } catch (...) {
        // Queued behind the chunks already in flight, so the consumer gets every chunk of the
        // earlier files first and this error where it belongs in file order.
        std::promise<Chunk> failed;
        failed.set_exception(std::current_exception());
        inflight_.push_back(failed.get_future());
        failed_ = true;
        return;
      }
      if (current_->size == 0) continue;  // an empty file has no chunks and no records
    }
    std::shared_ptr<OpenFile> of = current_;
    uint64_t offset = of->scheduled;
    size_t len = static_cast<size_t>(std::min<uint64_t>(opts_.chunk_size, of->size - offset));
    of->scheduled += len;
    bool last = of->scheduled >= of->size;
    size_t headroom = opts_.headroom;
    std::shared_ptr<BufferPool> pool = pool_;
    inflight_.push_back(threads_->submit([of, offset, len, last, headroom, pool]() -> Chunk {
      Chunk c;
      c.offset = offset;
      c.len = len;
      c.file_size = of->size;
      c.file_index = of->index;
      c.last = last;
      if (of->kind == EngineKind::Mmap) {
        of->map->populate(offset, len);
        c.owner = of->map;
        c.data = const_cast<uint8_t*>(of->map->data()) + offset;  // read-only: headroom stays 0
        c.contiguous = offset > 0;
        return c;
      }
      std::shared_ptr<AlignedBuffer> buf = pool->acquire();
      c.data = buf->data() + headroom;
      c.headroom = headroom;
      // O_DIRECT reads whole aligned blocks; the file's unaligned tail comes back as a short read.
      size_t want = of->kind == EngineKind::Direct ? align_up(len, of->offset_align) : len;
      size_t got = of->fh->pread_full(c.data, want, offset);
      DLSTORE_EXPECT(got >= len, Io, of->fh->path(), static_cast<int64_t>(offset + got),
                     "short read: expected " << len << " bytes at offset " << offset << ", got " << got
                                             << " (was the file truncated while being read?)");
      c.owner = buf;
      return c;
    }));
  }
}

bool ChunkReader::next(Chunk& out) {
  fill();
  if (inflight_.empty()) return false;
  std::future<Chunk> f = std::move(inflight_.front());
  inflight_.pop_front();
  out = f.get();  // rethrows a read error with its file and offset
  bytes_read_ += out.len;
  fill();
  return true;
}

}  // namespace dlstore
