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
    hints_.chunk_size = engine.chunk_size;
    hints_.sequential = sequential;
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
  const uint8_t* base = nullptr;  // every record's payload lies in [base, base + len) ...
  size_t len = 0;
  bool scattered = false;         // ... unless set (records in several mappings, or joined apart)
  bool owns_memory = true;        // a buffer of its own (not a view into a file's mapping)
  std::vector<const uint8_t*> data;  // per read position of the chunk; nullptr: not read, or corrupt
  std::vector<uint64_t> length;
  std::vector<std::shared_ptr<AlignedBuffer>> joined;  // multi-part RecordIO records
  std::vector<std::pair<uint32_t, std::string>> bad;   // (index in the chunk, what is wrong)
  std::vector<uint64_t> bad_at;                        // where in the file, per entry of `bad`
  uint64_t bytes_read = 0;
  // A file that would not open or read: the records from `failed_from` on are not there, and this
  // is why. The records before it were read, so they still go out before the error is raised.
  std::exception_ptr failure;
  size_t failed_from = 0;
};

namespace {

struct Piece {
  size_t first, last;   // read positions [first, last)
  uint32_t file;
  uint64_t start, end;  // bytes [start, end) of the file
};

// The chunk's needed records, neighbours in one file joined into one piece each.
std::vector<Piece> pieces_of(const ReadPlan& plan, const std::vector<uint8_t>& needed, size_t b, size_t e) {
  std::vector<Piece> out;
  size_t i = b;
  while (i < e) {
    if (needed[i] == 0) {
      ++i;
      continue;
    }
    Piece p{i, i + 1, plan.file[i], plan.offset[i], plan.offset[i] + plan.size[i]};
    while (p.last < e && needed[p.last] != 0 && plan.file[p.last] == p.file && plan.offset[p.last] == p.end) {
      p.end += plan.size[p.last];
      ++p.last;
    }
    out.push_back(p);
    i = p.last;
  }
  return out;
}

std::unique_ptr<PlanReader::Loaded> load_chunk(const ReadPlan& plan, const std::vector<uint8_t>& needed, size_t b,
                                               size_t e, Format format, bool verify, FileCache& files,
                                               BufferPool& pool, PlanReader::Progress& progress) {
  auto out = std::make_unique<PlanReader::Loaded>();
  out->data.assign(e - b, nullptr);
  out->length.assign(e - b, 0);

  // Open every file first: the layout of the buffer depends on each file's engine and alignment. A
  // file that fails cuts the chunk short there (read errors below do the same).
  std::vector<Piece> pieces = pieces_of(plan, needed, b, e);
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
  }
  if (view && !pieces.empty()) {
    out->owner = opened[0]->map;
    out->owns_memory = false;
    out->base = reads[0].data;
    out->len = reads[0].len;
  }

  // Check each frame where it landed and find its payload.
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const uint8_t* at = piece_data[i];
    for (size_t r = p.first; r < p.last; ++r) {
      FramedRecord rec;
      uint64_t where = 0;
      std::string what = check_frame(format, at, plan.size[r], verify, rec, &where);
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
  return out;
}

}  // namespace

// ---- the reader ----------------------------------------------------------------------------------

PlanReader::PlanReader(ReadPlan plan, PlanOptions opts) : opts_(opts) {
  const size_t n = plan.file.size();
  DLSTORE_EXPECT(plan.offset.size() == n && plan.size.size() == n, Generic, "", -1,
                 "internal: a read plan needs as many offsets (" << plan.offset.size() << ") and sizes ("
                                                                 << plan.size.size() << ") as files (" << n << ")");
  DLSTORE_EXPECT(plan.device.empty() || plan.device.size() == plan.paths.size(), Generic, "", -1,
                 "internal: " << plan.device.size() << " devices for " << plan.paths.size() << " files");
  for (size_t i = 0; i < n; ++i)
    DLSTORE_EXPECT(plan.file[i] < plan.paths.size(), Generic, "", -1,
                   "internal: read position " << i << " names file " << plan.file[i] << " of "
                                              << plan.paths.size());
  if (opts_.batch_size == 0) opts_.batch_size = 1;
  if (opts_.engine.depth == 0) opts_.engine.depth = 1;
  emit_ = std::move(plan.emit);
  // Which read positions are emitted: all of them, in read order, unless an emission order says.
  auto needed = std::make_shared<std::vector<uint8_t>>(n, emit_.empty() ? 1 : 0);
  for (int64_t pos : emit_) {
    DLSTORE_EXPECT(pos >= 0 && static_cast<size_t>(pos) < n, Generic, "", -1,
                   "internal: the emission order names read position " << pos << " of " << n);
    DLSTORE_EXPECT((*needed)[pos] == 0, Generic, "", -1,
                   "internal: the emission order names read position " << pos << " twice");
    (*needed)[pos] = 1;
  }
  needed_ = needed;
  done_.assign(n, 0);
  n_emit_ = emit_.empty() ? n : emit_.size();
  plan_ = std::make_shared<const ReadPlan>(std::move(plan));
  // The plan's file list, shared with the batches (which name their records' files) and the file
  // cache: a pointer into the plan that keeps the plan alive, not a copy.
  paths_ = std::shared_ptr<const std::vector<std::string>>(plan_, &plan_->paths);
  plan_chunks();
  files_ = std::make_shared<FileCache>(paths_, opts_.engine, opts_.sequential, opts_.max_open_files);
  chunk_pool_ = BufferPool::shared(opts_.engine.chunk_size, kBufferAlign);
  batch_pool_ = BufferPool::shared(1u << 20, kBufferAlign);
  // Chunks are read by the threads of their device. Read order is emission order for most of the
  // plan, so chunks are also cut where the device changes (under a reordering emission), keeping each
  // chunk on one device; elsewhere a chunk goes to its first record's device.
  const std::vector<uint32_t>& device = plan_->device;
  size_t devices = 1;
  for (uint32_t d : device) devices = std::max<size_t>(devices, size_t(d) + 1);
  chunk_device_.assign(left_.size(), 0);
  if (!device.empty())
    for (size_t c = 0; c < left_.size(); ++c)
      if (begin_[c] < plan_->file.size()) chunk_device_[c] = device[plan_->file[begin_[c]]];
  for (size_t d = 0; d < devices; ++d) threads_.emplace_back(new ThreadPool(opts_.engine.threads));
}

PlanReader::~PlanReader() {
  if (abandoned_) {
    // A read is stuck in the kernel (a hung mount): joining its thread would hang here. The pool is
    // leaked on purpose; each task owns what it touches (plan, files, buffers) through shared pointers.
    for (auto& t : threads_) t.release();
    return;
  }
  for (auto& f : inflight_) {
    try {
      f.result.wait();
    } catch (...) {
    }
  }
}

void PlanReader::plan_chunks() {
  const ReadPlan& plan = *plan_;
  const size_t n = plan.file.size();
  const uint64_t limit = opts_.engine.chunk_size;
  const std::vector<uint8_t>& needed = *needed_;
  begin_.assign(1, 0);
  left_.clear();
  uint64_t bytes = 0;
  uint32_t count = 0;
  auto cut = [&](size_t at) {
    begin_.push_back(at);
    left_.push_back(count);
    bytes = 0;
    count = 0;
  };
  if (emit_.empty()) {
    // Read order is emission order: chunks end on batch boundaries, so every batch lies in one chunk
    // and is handed out as a view. A chunk takes whole batches up to chunk_size (at least one).
    const size_t batch = opts_.batch_size;
    const size_t head = opts_.first_batch > 0 ? std::min(opts_.first_batch, batch) : batch;
    for (size_t first = 0; first < n; first += (first == 0 ? head : batch)) {
      const size_t last = std::min(n, first + (first == 0 ? head : batch));
      uint64_t batch_bytes = 0;
      for (size_t i = first; i < last; ++i) batch_bytes += plan.size[i];
      if (count > 0 && bytes + batch_bytes > limit) cut(first);
      bytes += batch_bytes;
      count += static_cast<uint32_t>(last - first);
    }
  } else {
    // Records are gathered from the chunks held, so chunks follow the bytes only: needed records are
    // added while the chunk holds less than chunk_size (a block of about chunk_size is one read).
    const std::vector<uint32_t>& device = plan.device;
    uint32_t current = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!needed[i]) continue;
      const uint32_t d = device.empty() ? 0 : device[plan.file[i]];
      if (count > 0 && (bytes >= limit || d != current)) cut(i);
      current = d;
      bytes += plan.size[i];
      ++count;
    }
  }
  if (count > 0 || begin_.size() == 1) cut(n);
  begin_.back() = n;  // the last chunk runs to the end of the plan (records past it are not needed)
  loaded_.resize(left_.size());
}

size_t PlanReader::chunk_of(int64_t pos) const {
  return static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), static_cast<size_t>(pos)) -
                             begin_.begin()) - 1;
}

void PlanReader::fill() {
  const size_t chunks = left_.size();
  while (inflight_.size() < opts_.engine.depth && next_schedule_ < chunks) {
    const size_t c = next_schedule_++;
    if (left_[c] == 0) continue;  // nothing in it is emitted (a resumed plan)
    // The task owns what it touches, so one abandoned on a hung mount outlives this reader safely.
    auto progress = std::make_shared<Progress>();
    std::shared_ptr<const ReadPlan> plan = plan_;
    std::shared_ptr<const std::vector<uint8_t>> needed = needed_;
    std::shared_ptr<FileCache> files = files_;
    std::shared_ptr<BufferPool> pool = chunk_pool_;
    const size_t b = begin_[c], e = begin_[c + 1];
    const Format format = opts_.format;
    const bool verify = opts_.verify;
    inflight_.push_back({c, threads_[chunk_device_[c]]->submit([plan, needed, b, e, format, verify, files, pool,
                                                                progress]() {
                           return load_chunk(*plan, *needed, b, e, format, verify, *files, *pool, *progress);
                         }),
                         progress});
  }
}

void PlanReader::arrive() {
  InFlight& front = inflight_.front();
  const double timeout = opts_.engine.timeout_s;
  if (timeout > 0 && front.result.wait_for(std::chrono::duration<double>(timeout)) != std::future_status::ready) {
    abandoned_ = true;
    const int64_t pos = std::max<int64_t>(front.progress->pos.load(), static_cast<int64_t>(begin_[front.chunk]));
    const ReadPlan& plan = *plan_;
    const std::string& path = plan.paths[plan.file[pos]];
    const bool opening = front.progress->stage.load() == 1;
    throw_error(ErrorKind::Io, path, opening ? -1 : static_cast<int64_t>(plan.offset[pos]),
                std::string(opening ? "open timed out: the file did not open" : "read timed out: no data") +
                    " within " + std::to_string(timeout) + " s (a hung or very slow mount?)");
  }
  const size_t c = front.chunk;
  std::future<std::unique_ptr<Loaded>> result = std::move(front.result);
  inflight_.pop_front();
  std::unique_ptr<Loaded> loaded = result.get();  // rethrows a read error with its file and offset
  next_arrive_ = c + 1;
  const size_t b = begin_[c];
  if (loaded->failure) failures_[c] = {loaded->failed_from, loaded->failure};
  for (size_t i = 0; i < loaded->bad.size(); ++i)
    bad_[static_cast<int64_t>(b + loaded->bad[i].first)] = Corrupt{loaded->bad_at[i], loaded->bad[i].second};
  loaded->bad.clear();
  stats_.file_bytes_read += loaded->bytes_read;
  ++stats_.chunks;
  if (loaded->owns_memory) held_bytes_ += loaded->len;
  stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held_bytes_);
  loaded_[c] = std::move(loaded);
  held_.push_back(c);
  // Under a reordering emission, chunks arrive faster than a shuffle buffer's stragglers leave them:
  // past the budget the oldest are let go, their remaining records copied out.
  while (!emit_.empty() && opts_.hold_bytes > 0 && held_bytes_ > opts_.hold_bytes && held_.size() > 1)
    spill_oldest();
}

void PlanReader::ensure(size_t chunk) {
  // Chunks arrive in order; one that arrived is held, or was let go with its remaining records spilled.
  while (chunk >= next_arrive_) {
    fill();
    DLSTORE_EXPECT(!inflight_.empty(), Generic, "", -1, "internal: chunk " << chunk << " was never read");
    arrive();
  }
}

void PlanReader::release(size_t chunk) {
  std::unique_ptr<Loaded>& l = loaded_[chunk];
  if (!l) return;
  if (l->owns_memory) held_bytes_ -= l->len;
  l.reset();
  auto it = std::find(held_.begin(), held_.end(), chunk);
  if (it != held_.end()) held_.erase(it);
}

void PlanReader::spill_oldest() {
  const size_t c = held_.front();
  const Loaded& l = *loaded_[c];
  const size_t b = begin_[c], e = begin_[c + 1];
  const std::vector<uint8_t>& needed = *needed_;
  for (size_t pos = b; pos < e; ++pos) {
    const uint8_t* data = l.data[pos - b];
    if (!needed[pos] || done_[pos] || data == nullptr) continue;
    const uint64_t len = l.length[pos - b];
    auto copy = std::make_shared<AlignedBuffer>(static_cast<size_t>(std::max<uint64_t>(len, 1)), 64);
    std::memcpy(copy->data(), data, static_cast<size_t>(len));
    spilled_[static_cast<int64_t>(pos)] = {std::move(copy), len};
    ++stats_.spilled_records;
    stats_.spilled_bytes += len;
  }
  release(c);
}

const uint8_t* PlanReader::data_of(int64_t pos, uint64_t* len) const {
  if (!spilled_.empty()) {
    auto it = spilled_.find(pos);
    if (it != spilled_.end()) {
      *len = it->second.second;
      return it->second.first->data();
    }
  }
  const size_t c = chunk_of(pos);
  const Loaded& l = *loaded_[c];
  const size_t i = static_cast<size_t>(pos) - begin_[c];
  *len = l.length[i];
  return l.data[i];
}

void PlanReader::done_with(int64_t pos) {
  done_[pos] = 1;
  if (!spilled_.empty()) spilled_.erase(pos);
  const size_t c = chunk_of(pos);
  if (--left_[c] == 0) release(c);
}

bool PlanReader::next_batch(RecordBatch& out) {
  if (pending_error_) {
    std::exception_ptr e = pending_error_;
    pending_error_ = nullptr;
    std::rethrow_exception(e);
  }
  out.clear();
  picked_.clear();
  // The first batch may be shorter, so that a plan restarted mid-batch (a resume, a failover) keeps
  // its batches on the same boundaries as the epoch's.
  const size_t want = (k_ == 0 && opts_.first_batch > 0) ? std::min(opts_.first_batch, opts_.batch_size)
                                                         : opts_.batch_size;
  try {
    while (picked_.size() < want && k_ < n_emit_) {
      const int64_t pos = emit_at(k_);
      const size_t c = chunk_of(pos);
      ensure(c);
      if (!failures_.empty()) {  // a file of this chunk failed: its records from there on are missing
        auto failed = failures_.find(c);
        if (failed != failures_.end() && static_cast<size_t>(pos) >= failed->second.first &&
            (spilled_.empty() || spilled_.find(pos) == spilled_.end()))
          std::rethrow_exception(failed->second.second);
      }
      auto bad = bad_.empty() ? bad_.end() : bad_.find(pos);
      if (bad != bad_.end()) {
        const std::string& path = plan_->paths[plan_->file[pos]];
        const int64_t at = static_cast<int64_t>(bad->second.offset);
        if (opts_.on_error == OnError::Raise) {
          // The good records before it go out first; the error comes with the next call.
          std::exception_ptr e = std::make_exception_ptr(
              Error(ErrorKind::Corrupt, describe(path, at, bad->second.what), path, at));
          ++k_;
          done_with(pos);
          bad_.erase(bad);
          if (picked_.empty()) std::rethrow_exception(e);
          pending_error_ = e;
          break;
        }
        ++stats_.skipped;
        if (corruptions_.size() < RecordScanner::kMaxReports)
          corruptions_.push_back({plan_->file[pos], at, bad->second.what});
        bad_.erase(bad);
        ++k_;
        done_with(pos);
        continue;
      }
      picked_.push_back(pos);
      ++k_;
    }
  } catch (const Error& e) {
    // A read failed (or a corrupt record raised): the records before it go out first, and the error
    // comes with the next call; a caller that restarts the plan (on a replica) starts right after them.
    if (picked_.empty()) throw;
    pending_error_ = std::current_exception();
  }
  if (picked_.empty()) return false;
  build(out);
  for (int64_t pos : picked_) done_with(pos);
  fill();
  return true;
}

void PlanReader::build(RecordBatch& out) {
  const ReadPlan& plan = *plan_;
  const size_t n = picked_.size();
  out.paths = paths_;
  out.offsets.resize(n);
  out.lengths.resize(n);
  out.file_offsets.resize(n);
  out.file_indices.resize(n);
  std::vector<const uint8_t*> data(n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t pos = picked_[i];
    data[i] = data_of(pos, &out.lengths[i]);
    total += out.lengths[i];
    out.file_offsets[i] = plan.offset[pos];
    out.file_indices[i] = plan.file[pos];
  }
  out.file_index = out.file_indices[0];
  out.payload_bytes = total;
  // A view when every record lies in the one region of one held chunk (always so when records are
  // emitted in read order: chunks end on batch boundaries); else the records are copied together.
  const size_t c = chunk_of(picked_[0]);
  const Loaded* l = loaded_[c].get();
  bool view = l != nullptr && !l->scattered;
  for (size_t i = 0; view && i < n; ++i)
    view = data[i] >= l->base && data[i] + out.lengths[i] <= l->base + l->len && chunk_of(picked_[i]) == c;
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
    ++stats_.gathered_batches;
    stats_.gathered_bytes += total;
  }
  stats_.records += n;
  stats_.payload_bytes += total;
}

PlanStats PlanReader::stats() const {
  PlanStats s = stats_;
  s.buffers_allocated = chunk_pool_->allocated() + batch_pool_->allocated();
  return s;
}

std::vector<std::string> PlanReader::notes() const { return files_->notes(); }

}  // namespace dlstore
