#include "dlstore/engine.hpp"

#include "dlstore/error.hpp"

namespace dlstore {

// ---- what every engine shares ----------------------------------------------------------------------

void Engine::check_read(ReadRequest& r, size_t got) {
  const OpenedFile& f = *r.file;
  const uint64_t read_at = align_down(r.offset, f.offset_align);
  const size_t lead = static_cast<size_t>(r.offset - read_at);
  r.bytes_read = got;
  try {
    // Retried to the end of the file already: the file is shorter than its index or range says.
    DLSTORE_EXPECT(got >= lead + r.len, Io, f.path, static_cast<int64_t>(read_at + got),
                   "short read: expected " << r.len << " bytes at offset " << r.offset << ", got "
                                           << (got > lead ? got - lead : 0)
                                           << " (was the file truncated while being read?)");
  } catch (const Error&) {
    r.error = std::current_exception();
    return;
  }
  r.data = r.slot + lead;
}

bool Engine::cache_holds(const ReadRequest& r) {
  const OpenedFile& f = *r.file;
  // cache_first: the kernel tells this process about the file (page_cache_tells, asked at open).
  return f.cache_first && page_cache_holds(f.fh->fd(), r.offset, r.len, CacheProbe::Auto, true);
}

bool Engine::read_cached(ReadRequest& r, bool checked) {
  const OpenedFile& f = *r.file;
  if (!checked && !cache_holds(r)) return false;
  // A buffered descriptor for this read alone, opened by path: the files a plan holds open (a chunk's,
  // the least recently used kept) then need one descriptor each, not two. It is used only if it is
  // the file the O_DIRECT descriptor reads (not one renamed over its path since, nor a path gone).
  std::unique_ptr<FileHandle> buffered;
  try {
    buffered.reset(new FileHandle(f.path, false));
  } catch (const Error&) {
    return false;  // the path no longer opens: the O_DIRECT descriptor still reads the file
  }
  if (!buffered->same_file(*f.fh)) return false;
  // The bytes the check covered, where the O_DIRECT read would put them (after the aligned block's lead):
  // the rest of that block need not be cached, and is not read. Pages evicted since the check are read
  // from the device through the cache: the same bytes.
  const size_t lead = static_cast<size_t>(r.offset - align_down(r.offset, f.offset_align));
  try {
    const size_t got = buffered->pread_full(r.slot + lead, r.len, r.offset);
    check_read(r, lead + got);
    r.bytes_read = got;
  } catch (const Error&) {
    r.error = std::current_exception();
  }
  r.from_cache = true;
  return true;
}

void Engine::pread_one(ReadRequest& r) {
  const OpenedFile& f = *r.file;
  if (read_cached(r)) return;
  // O_DIRECT reads whole aligned blocks into an aligned slot, from the block holding `offset`; the
  // file's unaligned tail comes back as a short read.
  const uint64_t read_at = align_down(r.offset, f.offset_align);
  try {
    check_read(r, f.fh->pread_full(r.slot, f.slot_bytes(r.offset, r.len), read_at));
  } catch (const Error&) {
    r.error = std::current_exception();
  }
}

void Engine::read(ReadRequest* reqs, size_t n) const {
  for (size_t i = 0; i < n; ++i) pread_one(reqs[i]);
}

void read_all(ReadRequest* reqs, size_t n) {
  size_t i = 0;
  while (i < n) {
    const Engine* engine = reqs[i].file->engine.get();
    size_t j = i + 1;
    while (j < n && reqs[j].file->engine.get() == engine) ++j;
    engine->read(reqs + i, j - i);
    i = j;
  }
}

std::shared_ptr<FileHandle> open_direct(const std::string& path, size_t chunk_size, uint32_t* offset_align,
                                        uint32_t* memory_align, std::string* note) {
  std::shared_ptr<FileHandle> fh;
  try {
    fh = std::make_shared<FileHandle>(path, true);
  } catch (const Error& e) {
    if (e.kind != ErrorKind::Alignment) throw;
    *note = path + ": " + e.reason;
    return nullptr;
  }
  const DirectAlignment a = fh->direct_alignment();
  if (!a.supported) {
    *note = path + ": " + a.source + " reports that this file cannot do direct I/O";
    return nullptr;
  }
  // Buffers are aligned to 64 KiB at most (the pools' grain), and a chunk must hold whole blocks.
  if (a.memory > (64u << 10) || a.offset > (64u << 10) || chunk_size % a.offset != 0) {
    *note = path + ": alignment " + std::to_string(a.offset) + " from " + a.source + " is larger than supported";
    return nullptr;
  }
  *offset_align = a.offset;
  *memory_align = a.memory;
  return fh;
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


ChunkReader::ChunkReader(std::vector<std::string> paths, EngineOptions opts, size_t headroom,
                         std::vector<ByteRange> ranges)
    : paths_(std::move(paths)), ranges_(std::move(ranges)), opts_(opts) {
  if (ranges_.empty()) ranges_.resize(paths_.size());
  DLSTORE_EXPECT(ranges_.size() == paths_.size(), Generic, "", -1,
                 "internal: " << ranges_.size() << " byte ranges for " << paths_.size() << " files");
  // Chunks and headroom stay multiples of 64 KiB so that every direct-I/O alignment seen in
  // practice (512 B .. 64 KiB) holds for offsets, lengths and buffer addresses alike.
  constexpr size_t kGrain = 64u << 10;
  opts_.chunk_size = align_up(std::max<size_t>(opts_.chunk_size, kGrain), kGrain);
  headroom_ = align_up(std::max<size_t>(headroom, kGrain), kGrain);
  if (opts_.depth == 0) opts_.depth = 1;
  DLSTORE_EXPECT(opts_.threads > 0, Generic, "", -1, "internal: a reader needs at least one I/O thread");
  std::string note;
  engine_ = make_engine(opts_, &note);
  if (!note.empty()) notes_.push_back(note);
  pool_ = BufferPool::shared(headroom_ + opts_.chunk_size, kGrain);
  threads_.reset(new ThreadPool(opts_.threads, "I/O threads (io_threads)"));
}

ChunkReader::~ChunkReader() {
  // Reads still in flight (a pass stopped early, a read that timed out, a reader dropped while its
  // mount hangs) are not waited for: this runs where Python drops the reader, with the GIL held, and a
  // read on a hung mount may never return. The threads finish what they run and end on their own;
  // each queued task owns what it touches (file, engine, buffer) through shared pointers.
  if (abandoned_ || !inflight_.empty()) {
    if (threads_) threads_->abandon();
    if (opener_) opener_->abandon();
  }
}

void ChunkReader::close() {
  if (abandoned_ || inflight_.empty() || !threads_->ours()) return;  // a forked child: nothing will finish
  threads_->drop_queued();
  if (wait_all(inflight_, opts_.timeout_s, [](InFlight& f) -> std::future<Chunk>& { return f.chunk; }))
    inflight_.clear();
  else
    abandoned_ = true;
}

std::vector<std::string> ChunkReader::notes() const {
  std::vector<std::string> out = notes_;
  for (std::string& n : engine_->notes()) out.push_back(std::move(n));
  return out;
}

void ChunkReader::open_next_file() {
  const size_t index = next_file_;
  const std::string& path = paths_[index];
  const ByteRange range = ranges_[next_file_++];
  auto of = std::make_shared<OpenFile>();
  OpenHints hints;
  hints.chunk_size = opts_.chunk_size;
  hints.direct_cache = opts_.direct_cache;
  if (current_ && current_->file->path == path) {
    // The next range of the same file (records of one shard split into pieces): share the open
    // file or mapping instead of opening and mapping it again.
    of->file = current_->file;
  } else if (opts_.timeout_s > 0) {
    // A hung mount blocks open() and fstat() as well as reads: open on a thread of its own and wait
    // at most the timeout. The task owns copies of what it uses, so an abandoned one touches nothing
    // of this reader.
    auto note = std::make_shared<std::string>();
    std::shared_ptr<const Engine> engine = engine_;
    if (!opener_) opener_.reset(new ThreadPool(1, "the thread that opens files under read_timeout"));
    std::future<std::shared_ptr<OpenedFile>> opened =
        opener_->submit([path, engine, hints, note]() { return engine->open(path, hints, note.get()); });
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
    of->file = engine_->open(path, hints, &note);
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
    // An O_DIRECT chunk reads whole blocks, so a range starting mid-block makes its first chunk
    // shorter by the part of the block before it: every later chunk then starts aligned and the
    // whole-block read of any chunk fits in chunk_size (offset_align is 1 for other files).
    const uint64_t chunk_end = align_down(offset, file->offset_align) + opts_.chunk_size;
    size_t len = static_cast<size_t>(std::min<uint64_t>(chunk_end, of->end) - offset);
    of->scheduled += len;
    bool last = of->scheduled >= of->end;
    size_t headroom = headroom_;
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
      ReadRequest r;
      r.file = file.get();
      r.offset = offset;
      r.len = len;
      std::shared_ptr<AlignedBuffer> buf;
      if (!file->engine->views()) {
        buf = pool->acquire();
        r.slot = buf->data() + headroom;
      }
      file->engine->read(&r, 1);
      if (r.error) std::rethrow_exception(r.error);  // names the file and offset
      c.data = const_cast<uint8_t*>(r.data);
      c.from_cache = r.from_cache;
      if (buf) {
        // The bytes of an O_DIRECT read's first block before `offset` widen the headroom.
        c.headroom = static_cast<size_t>(r.data - buf->data());
        c.owner = buf;
      } else {
        c.owner = file->map;             // a view of the mapping: read-only, headroom stays 0
        c.map = file->map.get();
        c.contiguous = offset > range_start;  // the bytes before it are the file's own
      }
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
  if (out.from_cache) cache_bytes_read_ += out.len;
  fill();
  return true;
}

}  // namespace dlstore
