#include "dlstore/plan_reader.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>

#include "dlstore/error.hpp"
#include "dlstore/record_frame.hpp"

namespace dlstore {
namespace {

// Chunk and batch buffers are aligned to 64 KiB, the largest direct-I/O alignment accepted
// (open_direct), so any piece slot aligned within them is aligned in memory too.
constexpr size_t kBufferAlign = 64u << 10;

}  // namespace

// ---- open files, shared by the I/O tasks --------------------------------------------------------

// The plan's files, opened on first use by whichever I/O task needs one and kept open, at most
// `max_open` at a time (the least recently used closes when a task no longer holds it). Opening
// happens outside the lock, so a file on a hung mount delays only the task that opens it.
class FileCache {
 public:
  FileCache(std::shared_ptr<const std::vector<std::string>> paths, const EngineOptions& engine, bool sequential,
            size_t max_open)
      : paths_(std::move(paths)), max_open_(std::max<size_t>(max_open, 1)), open_(paths_->size()),
        where_(paths_->size()) {
    std::string note;
    engine_ = make_engine(engine, &note);
    if (!note.empty()) notes_.push_back(note);
    // Only O_DIRECT's alignment check reads it (a chunk must hold whole blocks): a plan reader's
    // reads are sized per piece, so any chunk_size the settings accept (64 KiB .. 1 GiB, not always a
    // multiple of the filesystem's block) may read O_DIRECT.
    hints_.chunk_size = align_up(std::max<uint64_t>(engine.chunk_size, kBufferAlign), kBufferAlign);
    hints_.sequential = sequential;
    hints_.direct_cache = engine.direct_cache;
  }

  std::shared_ptr<OpenedFile> get(uint32_t index) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (open_[index]) {
        lru_.splice(lru_.begin(), lru_, where_[index]);
        return open_[index];
      }
    }
    std::string note;
    std::shared_ptr<OpenedFile> f = engine_->open((*paths_)[index], hints_, &note);
    std::lock_guard<std::mutex> lock(mu_);
    if (!note.empty()) notes_.push_back(note);
    if (open_[index]) return open_[index];  // another task opened it meanwhile
    open_[index] = f;
    lru_.push_front(index);
    where_[index] = lru_.begin();
    if (lru_.size() > max_open_) {
      const uint32_t victim = lru_.back();  // tasks still reading it keep their own reference
      lru_.pop_back();
      open_[victim].reset();
    }
    return f;
  }

  size_t note_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return notes_.size() + engine_->notes().size();
  }

  // Per-file notes (direct -> buffered) and the engine's own.
  std::vector<std::string> notes() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out = notes_;
    for (std::string& n : engine_->notes()) out.push_back(std::move(n));
    return out;
  }

 private:
  std::shared_ptr<const std::vector<std::string>> paths_;
  std::shared_ptr<const Engine> engine_;
  OpenHints hints_;
  size_t max_open_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<OpenedFile>> open_;
  std::list<uint32_t> lru_;  // most recently used first
  std::vector<std::list<uint32_t>::iterator> where_;
  std::vector<std::string> notes_;
};

// ---- one chunk, read and checked on an I/O thread ------------------------------------------------

struct PlanReader::Progress {
  std::atomic<int> stage{0};     // 0 queued, 1 opening, 2 reading
  std::atomic<int64_t> pos{-1};  // the read position it is at
};

struct PlanReader::Loaded {
  std::shared_ptr<void> owner;    // the chunk's buffer, or the mapping its one piece lies in
  const Mapping* map = nullptr;   // that mapping (a view; owner keeps it): checked before a batch views it
  const uint8_t* base = nullptr;  // every record's payload lies in [base, base + len) ...
  size_t len = 0;
  bool scattered = false;         // ... unless set (records in several mappings, or joined apart)
  bool owns_memory = true;        // a buffer of its own (not a view into a file's mapping)
  size_t first = 0;               // the chunk's first read position: data and length start there
  std::vector<const uint8_t*> data;  // per read position of the chunk; nullptr: not read, or corrupt
  std::vector<uint64_t> length;
  std::vector<std::shared_ptr<AlignedBuffer>> joined;  // multi-part RecordIO records
  std::vector<std::pair<uint32_t, std::string>> bad;   // (index in the chunk, what is wrong)
  std::vector<uint64_t> bad_at;                        // where in the file, per entry of `bad`
  uint64_t bytes_read = 0;
  uint64_t cache_bytes_read = 0;  // of those, O_DIRECT files' bytes read from the page cache
  // A file that would not open or read: the records from `failed_from` on are not there, and this
  // is why. The records before it were read, so they still go out before the error is raised.
  std::exception_ptr failure;
  size_t failed_from = 0;
};

namespace {

std::unique_ptr<PlanReader::Loaded> load_chunk(const ReadPlan& plan, std::vector<Piece> pieces, size_t b,
                                               size_t e, Format format, bool verify, FileCache& files,
                                               BufferPool& pool, PlanReader::Progress& progress) {
  auto out = std::make_unique<PlanReader::Loaded>();
  out->first = b;
  out->data.assign(e - b, nullptr);
  out->length.assign(e - b, 0);

  // Open every file first: the layout of the buffer depends on each file's engine and alignment. A
  // file that fails cuts the chunk short there (read errors below do the same).
  auto fail = [&](size_t piece) {
    out->failure = std::current_exception();
    out->failed_from = pieces[piece].first;
    pieces.resize(piece);
  };
  std::vector<std::shared_ptr<OpenedFile>> opened;
  opened.reserve(pieces.size());
  progress.stage.store(1);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    progress.pos.store(static_cast<int64_t>(p.first));
    try {
      opened.push_back(i == 0 || pieces[i - 1].file != p.file ? files.get(p.file) : opened.back());
      const OpenedFile& f = *opened.back();
      DLSTORE_EXPECT(p.end <= f.size, Io, f.path, static_cast<int64_t>(p.start),
                     "byte range [" << p.start << ", " << p.end << ") is outside the file of " << f.size
                                    << " bytes (did the file change since its index was made?)");
    } catch (const Error&) {
      fail(i);
      opened.resize(i);
      break;
    }
  }
  progress.stage.store(2);
  if (pieces.empty()) return out;

  // One read per piece, all handed to the engine at once (io_uring keeps them in flight together).
  // A single piece of an engine with views (mmap) is used where it lies, no copy; else the pieces land
  // one after the other in one buffer, each slot as large and as aligned as its file's engine needs
  // (an O_DIRECT piece reads whole blocks, so its records start a little into its slot).
  std::vector<ReadRequest> reads(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    reads[i].file = opened[i].get();
    reads[i].offset = pieces[i].start;
    reads[i].len = static_cast<size_t>(pieces[i].end - pieces[i].start);
  }
  const bool view = pieces.size() == 1 && opened[0]->engine->views();
  std::shared_ptr<AlignedBuffer> buf;
  if (!view) {
    std::vector<uint64_t> slot(pieces.size());
    uint64_t cursor = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const OpenedFile& f = *opened[i];
      cursor = align_up(cursor, std::max<uint32_t>(f.memory_align, 8));
      slot[i] = cursor;
      cursor += f.slot_bytes(reads[i].offset, reads[i].len);
    }
    buf = pool.acquire(static_cast<size_t>(cursor));
    for (size_t i = 0; i < pieces.size(); ++i) reads[i].slot = buf->data() + slot[i];
    out->owner = buf;
    out->base = buf->data();
    out->len = static_cast<size_t>(cursor);
  }
  progress.pos.store(static_cast<int64_t>(pieces[0].first));
  read_all(reads.data(), reads.size());
  std::vector<const uint8_t*> piece_data(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (reads[i].error) {
      // The records of the pieces before it go out; this one's error comes where it belongs.
      progress.pos.store(static_cast<int64_t>(pieces[i].first));
      out->failure = reads[i].error;
      out->failed_from = pieces[i].first;
      pieces.resize(i);
      break;
    }
    piece_data[i] = reads[i].data;
    out->bytes_read += reads[i].bytes_read;
    if (reads[i].from_cache) out->cache_bytes_read += reads[i].bytes_read;
  }
  if (view && !pieces.empty()) {
    // The frames are checked below where they lie, in the mapping: a file cut short since it was opened
    // is an I/O error here, not a SIGBUS (the batch that takes these records probes them again).
    try {
      const Mapping& map = *opened[0]->map;
      map.expect_holds(static_cast<uint64_t>(reads[0].data - map.data()), reads[0].len);
    } catch (const Error&) {
      progress.pos.store(static_cast<int64_t>(pieces[0].first));
      out->failure = std::current_exception();
      out->failed_from = pieces[0].first;
      pieces.clear();
      return out;
    }
    out->owner = opened[0]->map;
    out->map = opened[0]->map.get();
    out->owns_memory = false;
    out->base = reads[0].data;
    out->len = reads[0].len;
  }

  // Check each frame where it landed and find its payload. In a mapping, a file cut short after the check
  // above loses pages under the loop: they read as zeros (MappedTouches), and the file is checked again after.
  std::unique_ptr<MappedTouches> touches;
  if (view) touches.reset(new MappedTouches());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const uint8_t* at = piece_data[i];
    for (size_t r = p.first; r < p.last; ++r) {
      FramedRecord rec;
      uint64_t where = 0;
      const bool tail = plan.offset[r] + plan.size[r] == opened[i]->size;
      std::string what = check_frame(format, at, plan.size[r], verify, tail, rec, &where);
      if (!what.empty()) {
        out->bad.emplace_back(static_cast<uint32_t>(r - b), std::move(what));
        out->bad_at.push_back(plan.offset[r] + where);
      } else {
        out->data[r - b] = rec.data;
        out->length[r - b] = rec.len;
        if (rec.assembled) {
          out->joined.push_back(std::move(rec.assembled));
          out->scattered = true;
        }
      }
      at += plan.size[r];
    }
  }
  if (touches && touches->lost()) {
    touches.reset();
    try {
      const Mapping& map = *opened[0]->map;
      map.expect_holds(static_cast<uint64_t>(out->base - map.data()), out->len);
      map.lost(static_cast<uint64_t>(out->base - map.data()), out->len);  // held again: gone for a moment all the same
    } catch (const Error&) {
      progress.pos.store(static_cast<int64_t>(pieces[0].first));
      out->failure = std::current_exception();
      out->failed_from = pieces[0].first;
      out->bad.clear();  // what the lost pages' zeros failed: not corrupt records
      out->bad_at.clear();
    }
  }
  return out;
}

}  // namespace

// ---- the reader: the schedule's steps carried out in host memory --------------------------------

namespace {

ScheduleOptions schedule_options(const PlanOptions& o) {
  ScheduleOptions s;
  s.chunk_size = o.engine.chunk_size;
  s.depth = o.engine.depth;
  s.batch_size = o.batch_size;
  s.first_batch = o.first_batch;
  s.hold_bytes = o.hold_bytes;
  s.on_error = o.on_error;
  // Each I/O thread holds the files of the chunk it reads open; with the files kept open (max_open_files)
  // that stays within what the process may open.
  s.max_chunk_files = std::max<size_t>(16, o.max_open_files / std::max<size_t>(1, 2 * o.engine.threads));
  return s;
}

}  // namespace

PlanReader::PlanReader(ReadPlan plan, PlanOptions opts) : schedule_(std::move(plan), schedule_options(opts)), opts_(opts) {
  files_ = std::make_shared<FileCache>(schedule_.shared_paths(), opts_.engine, opts_.sequential, opts_.max_open_files);
  chunk_pool_ = BufferPool::shared(opts_.engine.chunk_size, kBufferAlign);
  batch_pool_ = BufferPool::shared(1u << 20, kBufferAlign);
  loaded_.resize(schedule_.num_chunks());
  for (size_t d = 0; d < schedule_.num_devices(); ++d)
    threads_.emplace_back(new ThreadPool(opts_.engine.threads, "I/O threads (io_threads)"));
  publish();
}

PlanReader::~PlanReader() {
  // Reads in flight are not waited for (a window read ahead and dropped at a failover, a pass stopped
  // early, a hung mount): this runs where Python drops the reader, with the GIL held. The threads
  // finish what they run and end on their own; each task owns what it touches (plan, files,
  // buffers) through shared pointers.
  if (abandoned_ || !inflight_.empty())
    for (auto& t : threads_) t->abandon();
}

void PlanReader::close() {
  if (abandoned_ || inflight_.empty() || !threads_.front()->ours()) return;  // a forked child: nothing will finish
  for (auto& t : threads_) t->drop_queued();
  if (wait_all(inflight_, opts_.engine.timeout_s, [](InFlight& f) -> auto& { return f.result; }))
    inflight_.clear();
  else
    abandoned_ = true;
}

void PlanReader::submit(size_t c) {
  // The task owns what it touches, so one abandoned on a hung mount outlives this reader safely.
  auto progress = std::make_shared<Progress>();
  std::shared_ptr<const ReadPlan> plan = schedule_.shared_plan();
  std::shared_ptr<FileCache> files = files_;
  std::shared_ptr<BufferPool> pool = chunk_pool_;
  std::vector<Piece> pieces = schedule_.pieces(c);
  const size_t b = pieces.empty() ? 0 : pieces.front().first, e = pieces.empty() ? 0 : pieces.back().last;
  const Format format = opts_.format;
  const bool verify = opts_.verify;
  inflight_.push_back({c, threads_[schedule_.chunk_device(c)]->submit([plan, pieces, b, e, format, verify, files, pool,
                                                                       progress]() mutable {
                         return load_chunk(*plan, std::move(pieces), b, e, format, verify, *files, *pool, *progress);
                       }),
                       progress});
}

Arrival PlanReader::wait(size_t c) {
  DLSTORE_EXPECT(!inflight_.empty() && inflight_.front().chunk == c, Generic, "", -1,
                 "internal: chunk " << c << " is not the next read in flight");
  InFlight& front = inflight_.front();
  const double timeout = opts_.engine.timeout_s;
  if (timeout > 0 && front.result.wait_for(std::chrono::duration<double>(timeout)) != std::future_status::ready) {
    abandoned_ = true;
    const ReadPlan& plan = schedule_.plan();
    const std::vector<Piece> pieces = schedule_.pieces(c);
    const int64_t pos = std::max<int64_t>(front.progress->pos.load(), static_cast<int64_t>(pieces.front().first));
    const std::string& path = plan.paths[plan.file[pos]];
    const bool opening = front.progress->stage.load() == 1;
    throw_error(ErrorKind::Io, path, opening ? -1 : static_cast<int64_t>(plan.offset[pos]),
                std::string(opening ? "open timed out: the file did not open" : "read timed out: no data") +
                    " within " + std::to_string(timeout) + " s (a hung or very slow mount?)");
  }
  std::future<std::unique_ptr<Loaded>> result = std::move(front.result);
  inflight_.pop_front();
  std::unique_ptr<Loaded> loaded = result.get();  // rethrows a read error with its file and offset
  Arrival a;
  a.bytes_read = loaded->bytes_read;
  a.cache_bytes_read = loaded->cache_bytes_read;
  a.held_bytes = loaded->owns_memory ? loaded->len : 0;
  a.failure = loaded->failure;
  a.failed_from = loaded->failed_from;
  const size_t b = loaded->first;
  for (size_t i = 0; i < loaded->bad.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(b + loaded->bad[i].first);
    a.bad.push_back(pos);
    a.bad_at.push_back(loaded->bad_at[i]);  // where in the file
    a.bad_what.push_back(std::move(loaded->bad[i].second));
  }
  loaded->bad.clear();
  loaded_[c] = std::move(loaded);
  return a;
}

void PlanReader::spill(size_t c, const std::vector<int64_t>& positions) {
  const Loaded& l = *loaded_[c];
  for (int64_t pos : positions) {
    const size_t i = static_cast<size_t>(pos) - l.first;
    const uint8_t* data = l.data[i];
    const uint64_t len = l.length[i];
    auto copy = std::make_shared<AlignedBuffer>(static_cast<size_t>(std::max<uint64_t>(len, 1)), 64);
    std::memcpy(copy->data(), data, static_cast<size_t>(len));
    spilled_[pos] = {std::move(copy), len};
    moved_.spilled_bytes += len;
  }
}

const uint8_t* PlanReader::data_of(int64_t pos, int64_t chunk, uint64_t* len) const {
  if (chunk < 0) {
    const auto& s = spilled_.at(pos);
    *len = s.second;
    return s.first->data();
  }
  const Loaded& l = *loaded_[static_cast<size_t>(chunk)];
  const size_t i = static_cast<size_t>(pos) - l.first;
  *len = l.length[i];
  return l.data[i];
}

void PlanReader::start() {
  PublishOnExit<PlanReader> on_exit{*this};
  if (pending_) return;
  for (;;) {
    Step s = schedule_.next();
    if (s.kind != Step::Kind::Read) {
      pending_ = std::make_unique<Step>(std::move(s));
      return;
    }
    submit(s.chunk);
  }
}

bool PlanReader::next_batch(RecordBatch& out) {
  PublishOnExit<PlanReader> on_exit{*this};
  out.clear();
  for (;;) {
    Step s;
    if (pending_) {
      s = std::move(*pending_);
      pending_.reset();
    } else {
      s = schedule_.next();
    }
    switch (s.kind) {
      case Step::Kind::Read:
        submit(s.chunk);
        break;
      case Step::Kind::Wait:
        schedule_.arrived(s.chunk, wait(s.chunk));
        break;
      case Step::Kind::Spill:
        spill(s.chunk, s.positions);
        break;
      case Step::Kind::Release:
        loaded_[s.chunk].reset();
        break;
      case Step::Kind::Batch:
        build(s, out);
        return true;
      case Step::Kind::End:
        return false;
    }
  }
}

void PlanReader::build(const Step& batch, RecordBatch& out) {
  const ReadPlan& plan = schedule_.plan();
  const std::vector<int64_t>& picked = batch.positions;
  const size_t n = picked.size();
  out.paths = schedule_.shared_paths();
  out.offsets.resize(n);
  out.lengths.resize(n);
  out.file_offsets.resize(n);
  out.file_indices.resize(n);
  // A chunk that is a view of a mapping (mmap) may have arrived before its file was cut short: touching
  // it now would be a SIGBUS, so the batch is an I/O error naming the file instead (a failover).
  // Each distinct chunk once: under the block and buffer shuffles a batch's records come from many chunks, in
  // no order.
  std::vector<int64_t> views;
  for (int64_t c : batch.chunks)
    if (c >= 0 && loaded_[static_cast<size_t>(c)]->map) views.push_back(c);
  std::sort(views.begin(), views.end());
  views.erase(std::unique(views.begin(), views.end()), views.end());
  for (int64_t c : views) {
    const Loaded& l = *loaded_[static_cast<size_t>(c)];
    l.map->expect_holds(static_cast<uint64_t>(l.base - l.map->data()), l.len);
  }
  std::vector<const uint8_t*> data(n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t pos = picked[i];
    data[i] = data_of(pos, batch.chunks[i], &out.lengths[i]);
    total += out.lengths[i];
    out.file_offsets[i] = plan.offset[pos];
    out.file_indices[i] = plan.file[pos];
  }
  out.file_index = out.file_indices[0];
  out.payload_bytes = total;
  // A view when every record lies in the one region of one held chunk (always so when records are
  // emitted in read order: chunks end on batch boundaries); else the records are copied together.
  const int64_t c = batch.chunks[0];
  const Loaded* l = c < 0 ? nullptr : loaded_[static_cast<size_t>(c)].get();
  bool view = l != nullptr && !l->scattered;
  for (size_t i = 0; view && i < n; ++i)
    view = batch.chunks[i] == c && data[i] >= l->base && data[i] + out.lengths[i] <= l->base + l->len;
  if (view) {
    out.owner = l->owner;
    out.base = l->base;
    out.region_len = l->len;
    for (size_t i = 0; i < n; ++i) out.offsets[i] = static_cast<uint64_t>(data[i] - l->base);
  } else {
    std::shared_ptr<AlignedBuffer> buf = batch_pool_->acquire(static_cast<size_t>(total));
    uint64_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      if (out.lengths[i]) std::memcpy(buf->data() + at, data[i], static_cast<size_t>(out.lengths[i]));
      out.offsets[i] = at;
      at += out.lengths[i];
    }
    out.owner = buf;
    out.base = buf->data();
    out.region_len = static_cast<size_t>(total);
    ++moved_.gathered_batches;
    moved_.gathered_bytes += total;
  }
  // Counted here, once the batch is built, not when the schedule picked it: a mapped chunk found cut short
  // above fails the batch over (its records are read again elsewhere and counted then).
  moved_.records += n;
  moved_.payload_bytes += total;
  if (!spilled_.empty())
    for (int64_t pos : picked) spilled_.erase(pos);
}

void PlanReader::publish() noexcept {
  try {
    PlanStats s = schedule_.stats();
    s.records = moved_.records;
    s.payload_bytes = moved_.payload_bytes;
    s.gathered_batches = moved_.gathered_batches;
    s.gathered_bytes = moved_.gathered_bytes;
    s.spilled_bytes = moved_.spilled_bytes;
    s.buffers_allocated = chunk_pool_->allocated() + batch_pool_->allocated();
    report_.publish(s, files_->note_count(), [this] { return files_->notes(); }, schedule_.corruptions());
  } catch (...) {  // out of memory building the notes: the last report stands
  }
}

}  // namespace dlstore
